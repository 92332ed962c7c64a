package nvme

import (
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
)

// sameStripe returns a key of namespace ns other than a whose stripe is
// a's.
func sameStripe(ns uint32, a Key) Key {
	k := Key{NS: ns, Hash: shm.Hash{Hi: 1 << 40, Lo: uint64(stripeOf(a)) ^ uint64(ns)}}
	if k == a || stripeOf(k) != stripeOf(a) {
		panic("sameStripe: no such key")
	}
	return k
}

// blockAt makes the first pass of the store's code through point (see
// Store.testHook) stop there until release is closed; entered is closed
// once it stops there. For "put", that is a write to a slow disk with its
// stripes locked.
func blockAt(s *Store, point string) (entered, release chan struct{}) {
	ent, rel := blockAtEach(s, point)
	return ent[0], rel[0]
}

// blockAtEach is blockAt for several points at once (one hook).
func blockAtEach(s *Store, points ...string) (entered, release []chan struct{}) {
	once := make([]sync.Once, len(points))
	for range points {
		entered = append(entered, make(chan struct{}))
		release = append(release, make(chan struct{}))
	}
	s.testHook = func(p string) {
		if i := slices.Index(points, p); i >= 0 {
			once[i].Do(func() {
				close(entered[i])
				<-release[i]
			})
		}
	}
	return entered, release
}

func hiddenLen(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.hidden)
}

func waitNoHidden(t *testing.T, s *Store) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); hiddenLen(s) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d hidden blocks never deleted", hiddenLen(s))
		}
	}
}

func keysOf(s *Store) []Key {
	var ks []Key
	s.Keys(func(k Key, _ int64) bool { ks = append(ks, k); return true })
	return ks
}

// TestDeleteDoesNotWaitForAWrite: a Delete (the daemon calls it on a
// client's ring loop) of a block whose stripe a write to a slow disk
// holds — another block's, or a new version of the same block — returns
// at once, and the blocks are gone from then on: not served, not listed,
// not back after the write finishes, nor after a restart, whether the
// deleter removed them before Close or Close did.
func TestDeleteDoesNotWaitForAWrite(t *testing.T) {
	for _, closeAtOnce := range []bool{false, true} {
		name := "deleter"
		if closeAtOnce {
			name = "close"
		}
		t.Run(name, func(t *testing.T) {
			const small, large = 64 << 10, 128 << 10
			dir := t.TempDir()
			s := openT(t, dir, 256<<20)
			a := testKey(1, 0)
			b := sameStripe(1, a)
			other := testKey(2, 5) // a bystander, kept
			for _, k := range []Key{a, b, other} {
				if err := s.Put(k, payloadFor(k, small)); err != nil {
					t.Fatal(err)
				}
			}
			entered, release := blockAt(s, "put")
			putDone := make(chan error, 1)
			go func() { putDone <- s.Put(a, payloadFor(a, large)) }()
			<-entered

			delDone := make(chan error, 2)
			go func() { delDone <- s.Delete(b); delDone <- s.Delete(a) }()
			for range 2 {
				select {
				case err := <-delDone:
					if err != nil {
						t.Fatalf("delete: %v", err)
					}
				case <-time.After(10 * time.Second):
					close(release)
					t.Fatal("Delete waited for a write that holds its key's stripe (a slow disk stalls the ring loop)")
				}
			}
			for _, k := range []Key{a, b} {
				if s.Contains(k) {
					t.Errorf("%v: Contains after Delete", k)
				}
				if _, ok := s.Size(k); ok {
					t.Errorf("%v: Size found it after Delete", k)
				}
				if _, err := s.Get(k, make([]byte, large)); !errors.Is(err, ErrNotFound) {
					t.Errorf("%v: Get after Delete: %v, want ErrNotFound", k, err)
				}
				_, errs := s.GetBatch([]Key{k}, [][]byte{make([]byte, large)})
				if !errors.Is(errs[0], ErrNotFound) {
					t.Errorf("%v: GetBatch after Delete: %v, want ErrNotFound", k, errs[0])
				}
			}
			if ks := keysOf(s); !slices.Equal(ks, []Key{other}) {
				t.Errorf("Keys after the deletes: %v, want only %v", ks, other)
			}

			close(release)
			if err := <-putDone; err != nil {
				t.Fatalf("the slow write: %v", err)
			}
			// The write of a began before its Delete: the Delete wins.
			if s.Contains(a) {
				t.Error("a write that began before the Delete brought the block back")
			}
			if !closeAtOnce {
				waitNoHidden(t, s)
				if st := s.Stats(); st.Blocks != 1 {
					t.Errorf("index holds %d blocks after the deleter ran, want 1", st.Blocks)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openT(t, dir, 256<<20)
			defer s.Close()
			if ks := keysOf(s); !slices.Equal(ks, []Key{other}) {
				t.Fatalf("after a restart the store holds %v, want only %v", ks, other)
			}
			mustGet(t, s, other, small)
		})
	}
}

// TestPutAfterHiddenDeleteKeepsItsBlock: a Put of a block that begins
// after a Delete had to hide it (its stripe was busy), and gets the stripe
// before the deleter does, stores the new block: the deleter must not
// remove it.
func TestPutAfterHiddenDeleteKeepsItsBlock(t *testing.T) {
	const small, large = 64 << 10, 128 << 10
	dir := t.TempDir()
	s := openT(t, dir, 256<<20)
	a := testKey(3, 0)
	b := sameStripe(3, a)
	if err := s.Put(a, payloadFor(a, small)); err != nil {
		t.Fatal(err)
	}
	ent, rel := blockAtEach(s, "put", "hidden")
	putEntered, putRelease, delEntered, delRelease := ent[0], rel[0], ent[1], rel[1]
	bDone := make(chan error, 1)
	go func() { bDone <- s.Put(b, payloadFor(b, small)) }() // holds the stripe
	<-putEntered
	if err := s.Delete(a); err != nil {
		t.Fatal(err)
	}
	if hiddenLen(s) != 1 || s.Contains(a) {
		t.Fatalf("%d hidden blocks, a listed: %v; want a hidden", hiddenLen(s), s.Contains(a))
	}
	<-delEntered // the deleter waits until the new Put of a is done
	close(putRelease)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	if err := s.Put(a, payloadFor(a, large)); err != nil {
		t.Fatal(err)
	}
	if n := hiddenLen(s); n != 0 {
		t.Errorf("%d hidden blocks after a Put of a that followed its Delete, want 0", n)
	}
	close(delRelease)
	waitNoHidden(t, s)
	mustGet(t, s, a, large)
	mustGet(t, s, b, small)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, 256<<20)
	defer s.Close()
	mustGet(t, s, a, large)
	mustGet(t, s, b, small)
}

// TestHiddenDeletesAreBounded: while a write holds the stripe, Delete hides
// at most maxHidden blocks; the next waits for the lock (memory stays
// bounded however fast a client deletes), and all are deleted after.
func TestHiddenDeletesAreBounded(t *testing.T) {
	s := openT(t, t.TempDir(), 256<<20)
	defer s.Close()
	// Each hiding Delete logs its tombstone: maxHidden of them took 7 s
	// under the race detector.
	const maxHidden = 4096
	s.hiddenMax = maxHidden
	entered, release := blockAt(s, "put")
	a := testKey(4, 0)
	putDone := make(chan error, 1)
	go func() { putDone <- s.Put(a, payloadFor(a, 64<<10)) }()
	<-entered
	// Keys in a's stripe, which the write holds: every Delete is busy.
	keys := make([]Key, maxHidden+1)
	for i := range keys {
		keys[i] = Key{NS: 5, Hash: shm.Hash{Hi: uint64(i+1) << 6, Lo: uint64(stripeOf(a)) ^ 5}}
		if stripeOf(keys[i]) != stripeOf(a) {
			t.Fatalf("key %d in stripe %d, want %d", i, stripeOf(keys[i]), stripeOf(a))
		}
	}
	for _, k := range keys[:maxHidden] {
		if err := s.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	if n := hiddenLen(s); n != maxHidden {
		t.Fatalf("%d hidden, want %d", n, maxHidden)
	}
	done := make(chan error, 1)
	go func() { done <- s.Delete(keys[maxHidden]) }()
	select {
	case <-done:
		t.Fatalf("Delete returned with %d deletions hidden already", hiddenLen(s))
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-putDone; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitNoHidden(t, s)
}

// TestStatsLeaveOutHiddenBlocks: a block Delete hid (its stripe busy) is
// gone as far as callers know: Stats (the daemon's block and byte gauges
// of the tier, kvtierctl status) no longer counts it, as Get, Contains
// and Keys no longer see it.
func TestStatsLeaveOutHiddenBlocks(t *testing.T) {
	const size = 64 << 10
	s := openT(t, t.TempDir(), 256<<20)
	defer s.Close()
	a := testKey(6, 0)
	b := sameStripe(6, a)
	for _, k := range []Key{a, b} {
		if err := s.Put(k, payloadFor(k, size)); err != nil {
			t.Fatal(err)
		}
	}
	entered, release := blockAt(s, "put")
	putDone := make(chan error, 1)
	go func() { putDone <- s.Put(a, payloadFor(a, size)) }() // holds b's stripe
	<-entered
	if err := s.Delete(b); err != nil {
		t.Fatal(err)
	}
	if hiddenLen(s) != 1 {
		close(release)
		t.Fatalf("%d hidden blocks, want b hidden", hiddenLen(s))
	}
	st := s.Stats()
	close(release)
	if err := <-putDone; err != nil {
		t.Fatal(err)
	}
	if st.Blocks != 1 || st.Bytes != size {
		t.Errorf("Stats after b's Delete returned: %d blocks, %d bytes; want 1 block, %d bytes (a only)", st.Blocks, st.Bytes, size)
	}
	waitNoHidden(t, s)
	if st := s.Stats(); st.Blocks != 1 || st.Bytes != size {
		t.Errorf("Stats after the deleter ran: %d blocks, %d bytes; want 1, %d", st.Blocks, st.Bytes, size)
	}
}

// TestHiddenDeleteSurvivesACrash: a Delete that returned is not undone by
// a crash of the process (kill -9: what badger's log holds in the page
// cache survives), as a Put that returned is not, though its block was
// only hidden (a write held its stripe) when the process died.
// TestCrashSnapshots audits the same with random snapshots.
func TestHiddenDeleteSurvivesACrash(t *testing.T) {
	const size = 64 << 10
	base := t.TempDir()
	dir := filepath.Join(base, "nvme")
	s := openT(t, dir, 256<<20)
	a := testKey(7, 0)
	b := sameStripe(7, a)
	for _, k := range []Key{a, b} {
		if err := s.Put(k, payloadFor(k, size)); err != nil {
			t.Fatal(err)
		}
	}
	entered, release := blockAt(s, "put")
	putDone := make(chan error, 1)
	go func() { putDone <- s.Put(a, payloadFor(a, size)) }() // holds b's stripe
	<-entered
	if err := s.Delete(b); err != nil {
		close(release)
		t.Fatal(err)
	}
	// The process dies here: its files as they are now (a snapshot, as
	// TestCrashSnapshots takes of a stopped process).
	s = crashAndReopen(t, s, dir, func() {
		close(release)
		if perr := <-putDone; perr != nil {
			t.Fatal(perr)
		}
	})
	if s.Contains(b) {
		t.Fatal("a block whose Delete returned is back after a crash")
	}
	mustGet(t, s, a, size)
}

// TestHiddenDeleteSurvivesARelocationAndACrash: a Delete that hid a block
// compaction was moving (the move holds its stripe) logs its tombstone at
// once; the move's new record, committed after it, must not bring the
// block back at a restart after a crash before the deleter ran.
func TestHiddenDeleteSurvivesARelocationAndACrash(t *testing.T) {
	const size = 64 << 10
	base := t.TempDir()
	dir := filepath.Join(base, "nvme")
	s := openT(t, dir, 256<<20)
	k, other := testKey(8, 0), testKey(8, 1)
	for _, k := range []Key{k, other} {
		if err := s.Put(k, payloadFor(k, size)); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	i, _ := s.idx.get(k)
	from := s.idx.ents[i].seg
	s.mu.Unlock()
	ent, rel := blockAtEach(s, "move", "hidden")
	moveIn, moveGo, delIn, delGo := ent[0], rel[0], ent[1], rel[1]
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		var buf *[]byte
		s.relocate(k, from, &buf)
		if buf != nil {
			s.segs.putBuf(buf)
		}
	}()
	<-moveIn
	if err := s.Delete(k); err != nil {
		close(moveGo)
		t.Fatal(err)
	}
	close(moveGo)
	<-moved
	<-delIn // the deleter has not removed it yet
	s = crashAndReopen(t, s, dir, func() { close(delGo) })
	if s.Contains(k) {
		t.Fatal("a block whose Delete returned is back after a crash: the relocation's record outlived its tombstone")
	}
	mustGet(t, s, other, size)
}

// TestPutAfterHiddenDeleteOutlivesItsTombstone: a Put that supersedes a
// hidden Delete (it took the stripe after the Delete hid the block) while
// the Delete is still logging its tombstone keeps its block across a
// restart: its record is committed after the tombstone, not deleted by it.
func TestPutAfterHiddenDeleteOutlivesItsTombstone(t *testing.T) {
	const small, large = 64 << 10, 128 << 10
	dir := t.TempDir()
	s := openT(t, dir, 256<<20)
	a := testKey(9, 0)
	b := sameStripe(9, a)
	for _, k := range []Key{a, b} {
		if err := s.Put(k, payloadFor(k, small)); err != nil {
			t.Fatal(err)
		}
	}
	ent, rel := blockAtEach(s, "put", "tomb")
	putIn, putGo, tombIn, tombGo := ent[0], rel[0], ent[1], rel[1]
	aDone := make(chan error, 1)
	go func() { aDone <- s.Put(a, payloadFor(a, small)) }() // holds b's stripe
	<-putIn
	delDone := make(chan error, 1)
	go func() { delDone <- s.Delete(b) }()
	<-tombIn // b hidden, its tombstone not logged yet
	close(putGo)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	bDone := make(chan error, 1)
	go func() { bDone <- s.Put(b, payloadFor(b, large)) }()
	// The Put of b may finish, or wait for the tombstone; either way the
	// tombstone is logged next.
	select {
	case err := <-bDone:
		bDone <- err
	case <-time.After(50 * time.Millisecond):
	}
	close(tombGo)
	if err := <-delDone; err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	waitNoHidden(t, s)
	mustGet(t, s, b, large)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, 256<<20)
	defer s.Close()
	if !s.Contains(b) {
		t.Fatal("a Put that followed a hidden Delete lost its block at the restart: the Delete's tombstone, logged after its record, deleted it")
	}
	mustGet(t, s, b, large)
}

// TestHiddenDeleteDuringItsOwnWriteSurvivesACrash: a Delete of a block
// whose own write holds its stripe (a write-down racing the client's
// Delete) hides it and logs its tombstone at once; the write's record,
// committed after that tombstone, must not bring the block back at a
// restart after a crash before the deleter ran.
func TestHiddenDeleteDuringItsOwnWriteSurvivesACrash(t *testing.T) {
	const size = 64 << 10
	base := t.TempDir()
	dir := filepath.Join(base, "nvme")
	s := openT(t, dir, 256<<20)
	k, other := testKey(10, 0), testKey(10, 1)
	if err := s.Put(other, payloadFor(other, size)); err != nil {
		t.Fatal(err)
	}
	ent, rel := blockAtEach(s, "put", "hidden")
	putIn, putGo, delIn, delGo := ent[0], rel[0], ent[1], rel[1]
	putDone := make(chan error, 1)
	go func() { putDone <- s.Put(k, payloadFor(k, size)) }()
	<-putIn
	if err := s.Delete(k); err != nil {
		close(putGo)
		t.Fatal(err)
	}
	close(putGo)
	if err := <-putDone; err != nil {
		t.Fatal(err)
	}
	<-delIn // the deleter has not removed it yet
	if s.Contains(k) {
		t.Error("a block whose Delete returned is served")
	}
	s = crashAndReopen(t, s, dir, func() { close(delGo) })
	if s.Contains(k) {
		t.Fatal("a block whose Delete returned is back after a crash: its own write's record outlived its tombstone")
	}
	mustGet(t, s, other, size)
}

// crashAndReopen copies the store's directory dir as it is now (the files a
// process killed at this point leaves, as TestCrashSnapshots takes them),
// then runs resume (which lets the test's blocked goroutines go on), closes
// s and opens the copy, closed at the end of t.
func crashAndReopen(t *testing.T, s *Store, dir string, resume func()) *Store {
	t.Helper()
	snap := filepath.Join(filepath.Dir(dir), "snap")
	out, err := exec.Command("cp", "-a", dir, snap).CombinedOutput()
	resume()
	if err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, snap, 256<<20)
	t.Cleanup(func() { s.Close() })
	return s
}
