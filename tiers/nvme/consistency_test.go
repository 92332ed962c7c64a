package nvme

// Consistency of the index, badger and the segments' live bytes under
// races, and inputs at the edges (empty blocks, IOV_MAX, crafted files).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// waitPasses wakes the maintenance loop and waits for n full passes.
func waitPasses(s *Store, n int) {
	for range n {
		s.mu.Lock()
		ch := s.passDone
		s.mu.Unlock()
		s.wake()
		<-ch
	}
}

// TestEmptyBlockAfterReopen: a zero-length block (valid: TestPutGetDelete
// stores one) charges nothing to its segment, so its segment may look
// empty and be removed at reindex; the block must still read back (it
// used to read as a checksum failure and be deleted).
func TestEmptyBlockAfterReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	k := testKey(1, 1)
	if err := s.Put(k, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(k, nil); err != nil {
		t.Fatalf("Get before reopen: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, 64<<20)
	defer s.Close()
	if !s.Contains(k) {
		t.Fatal("reindex dropped the block")
	}
	if _, err := s.Get(k, nil); err != nil {
		t.Fatalf("Get after reopen: %v (checksum misses %d)", err, s.Stats().ChecksumMisses)
	}
}

// TestEmptyBlockOutlivesItsSegment: the same at runtime, when the
// maintenance loop removes the segment after its other blocks are deleted.
func TestEmptyBlockOutlivesItsSegment(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	defer s.Close()
	k := testKey(1, 1)
	if err := s.Put(k, nil); err != nil {
		t.Fatal(err)
	}
	var others []Key
	for i := range 8 {
		o := testKey(2, uint64(i))
		others = append(others, o)
		if err := s.Put(o, payloadFor(o, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range others {
		if err := s.Delete(o); err != nil {
			t.Fatal(err)
		}
	}
	waitPasses(s, 2)
	if _, err := s.Get(k, nil); err != nil {
		t.Fatalf("Get of zero-length block: %v (checksum misses %d, GC runs %d)", err, s.Stats().ChecksumMisses, s.Stats().GCRuns)
	}
}

// TestConcurrentMeasure: measure subtracts the writtenSince it loaded; two
// concurrent calls (the maintenance loop and a Put in waitRoom's
// filesystem-full branch) subtracted it twice, and the disk estimate went
// low exactly when the filesystem reserve mattered.
func TestConcurrentMeasure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	defer s.Close()
	for round := range 200 {
		s.writtenSince.Store(32 << 20)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); <-start; s.measure() }()
		}
		close(start)
		wg.Wait()
		if w := s.writtenSince.Load(); w < 0 {
			t.Fatalf("round %d: writtenSince = %d after two concurrent measures (nothing was written): the disk estimate is %d bytes low", round, w, -w)
		}
	}
}

var _ = errors.Is

// checkInvariants compares the index with badger's records and each
// segment's live bytes with what the index points at (store quiet).
func checkInvariants(s *Store) (bad []string) {
	s.gate.Lock() // no relocation or eviction meanwhile
	defer s.gate.Unlock()
	recs := map[Key]record{}
	_ = s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{prefixBlock}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k, _ := decodeKey(it.Item().Key())
			_ = it.Item().Value(func(v []byte) error {
				r, _ := decodeRecord(v)
				recs[k] = r
				return nil
			})
		}
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	live := map[uint32]int64{}
	var sum int64
	for k, i := range s.idx.m {
		e := s.idx.ents[i]
		sum += e.size
		live[e.seg] += s.segs.recLen(e.size)
		r, ok := recs[k]
		if !ok {
			bad = append(bad, fmt.Sprintf("index has %v (size %d) but badger has no record", k, e.size))
		} else if r.n != e.size || r.seg != e.seg {
			bad = append(bad, fmt.Sprintf("index says %v is %d bytes in seg %d, badger says %d in seg %d", k, e.size, e.seg, r.n, r.seg))
		}
	}
	for k, r := range recs {
		if _, ok := s.idx.m[k]; !ok {
			bad = append(bad, fmt.Sprintf("badger has %v (%d bytes, seg %d) but the index does not (a Put that returned nil is a miss)", k, r.n, r.seg))
		}
	}
	var pad, pinned int64
	for k, i := range s.idx.m {
		pad += s.idx.pad(s.idx.ents[i].size)
		if s.idx.pinned != nil && s.idx.pinned(k) {
			pinned += s.idx.ents[i].size
		}
	}
	if pad != s.idx.padBytes || pinned != s.idx.pinnedBytes {
		bad = append(bad, fmt.Sprintf("idx.padBytes %d, sum %d; idx.pinnedBytes %d, sum %d", s.idx.padBytes, pad, s.idx.pinnedBytes, pinned))
	}
	if sum != s.idx.bytes {
		bad = append(bad, fmt.Sprintf("idx.bytes %d, sum of sizes %d", s.idx.bytes, sum))
	}
	for _, sg := range s.segs.snapshot() {
		if l := sg.live.Load(); l != live[sg.id] || sg.pending.Load() != 0 {
			bad = append(bad, fmt.Sprintf("segment %d: live %d, index points at %d, pending %d", sg.id, l, live[sg.id], sg.pending.Load()))
		}
	}
	return bad
}

// stressUntilBroken runs writer(k) and reader(k, g) loops on nkeys keys in
// rounds of 200 ms and checks the invariants after each round.
func stressUntilBroken(t *testing.T, s *Store, nkeys int, d time.Duration,
	writer func(k Key, j int), reader func(k Key, g int)) (bad []string) {
	old := runtime.GOMAXPROCS(8) // more threads than cores: the OS preempts anywhere
	defer runtime.GOMAXPROCS(old)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		var stop atomic.Bool
		var wg sync.WaitGroup
		for i := range nkeys {
			k := testKey(1, uint64(i))
			wg.Add(3)
			go func() {
				defer wg.Done()
				for j := 0; !stop.Load(); j++ {
					writer(k, j)
				}
			}()
			for g := range 2 {
				go func() {
					defer wg.Done()
					for !stop.Load() {
						reader(k, g)
					}
				}()
			}
		}
		time.Sleep(200 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		if bad = checkInvariants(s); len(bad) > 0 {
			return bad
		}
	}
	return nil
}

// TestGetMissRacesDeleteAndPut: a Get that finds no record used to drop
// the key's index entry under s.mu alone, which could remove the entry of
// a newer Put (its segment then released twice, its blocks lost when the
// segment was removed). Broke within a second before the fix.
func TestGetMissRacesDeleteAndPut(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 256<<20)
	defer s.Close()
	const size = 4096
	bad := stressUntilBroken(t, s, 4, 2*time.Second,
		func(k Key, j int) {
			if j%2 == 0 {
				_ = s.Delete(k)
			}
			_ = s.Put(k, payloadFor(k, size))
		},
		func(k Key, _ int) { _, _ = s.Get(k, make([]byte, size)) })
	if len(bad) > 0 {
		t.Errorf("invariants broken:\n%v\nstats %+v", bad, s.Stats())
	}
}

// TestGetRacesResizingPuts: Get used to write the size of the record it
// read into the index after the fact, over the size of a Put that
// completed meanwhile (no Deletes: the miss path never runs). Broke
// within 1.5 s before the fix.
func TestGetRacesResizingPuts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 256<<20)
	defer s.Close()
	bad := stressUntilBroken(t, s, 4, 2*time.Second,
		func(k Key, j int) { _ = s.Put(k, payloadFor(k, 4096*(1+(j/2)%2))) },
		func(k Key, g int) {
			_, err := s.Get(k, make([]byte, 4096*(1+g)))
			if err != nil && !errors.Is(err, ErrShortBuffer) && !errors.Is(err, ErrNotFound) {
				t.Error(err)
			}
		})
	if len(bad) > 0 {
		t.Errorf("invariants broken:\n%v\nstats %+v", bad, s.Stats())
	}
}

// TestPutBatchOverIOVMax: on a filesystem whose STATX_DIOALIGN offset
// alignment is 512 (ext4/xfs on a 512-byte-LBA NVMe namespace) a 1 MiB
// PutBatch chunk can hold 2048 aligned records, and Linux refuses more
// than IOV_MAX (1024) iovecs in one pwritev (EINVAL). The test sets the
// alignment dioAlign would return there.
func TestPutBatchOverIOVMax(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	defer s.Close()
	s.segs.offAlign, s.segs.memAlign = 512, 512 // as dioAlign reports on a 512-byte-sector filesystem
	put := func(n int) error {
		keys := make([]Key, n)
		blocks := make([][]byte, n)
		for i := range keys {
			keys[i] = testKey(uint32(n), uint64(i))
			blocks[i] = alignedBuf(512)
			fillFor(keys[i], blocks[i])
		}
		return s.PutBatch(keys, blocks)
	}
	if err := put(1000); err != nil {
		t.Fatalf("PutBatch of 1000 aligned 512-byte blocks: %v", err)
	}
	if err := put(1500); err != nil {
		t.Fatalf("PutBatch of 1500 aligned 512-byte blocks: %v", err)
	}
}

func segFDs(t *testing.T, dir string) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd to count open files: %v", err)
	}
	n := 0
	for _, e := range ents {
		if p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(p, dir) {
			n++
		}
	}
	return n
}

// TestAliasSegmentNameIgnored: "0.seg" and "00000000.seg" both parse as
// segment 0; only the names the store writes are opened (the second used to
// replace the first in the map, whose fd then leaked).
func TestAliasSegmentNameIgnored(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	k := testKey(1, 1)
	if err := s.Put(k, payloadFor(k, 4096)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	segDir := filepath.Join(dir, segDirName)
	ents, _ := os.ReadDir(segDir)
	b, _ := os.ReadFile(filepath.Join(segDir, ents[0].Name()))
	if err := os.WriteFile(filepath.Join(segDir, "0.seg"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, 64<<20)
	s.Close()
	if n := segFDs(t, segDir); n != 0 {
		t.Fatalf("%d fds into %s still open after Close", n, segDir)
	}
}

// TestReindexRefusesOversizedRecord: reindex accepted a record of any
// length up to its segment file's size, though Put never writes one above
// MaxBlockBytes: a crafted record over a sparse file was charged to the
// budget with its claimed size, and the next Put evicted the whole cache.
func TestReindexRefusesOversizedRecord(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	for i := range 20 {
		k := testKey(2, uint64(i))
		if err := s.Put(k, payloadFor(k, 256<<10)); err != nil {
			t.Fatal(err)
		}
	}
	k := testKey(1, 1)
	if err := s.Put(k, payloadFor(k, 4096)); err != nil {
		t.Fatal(err)
	}
	rec := recordOf(t, s, k)
	maxBlock := s.MaxBlockBytes()
	s.Close()
	rec.n = 40 << 20
	db, err := badger.Open(badgerOptions(dir, Options{}, quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	var kb [keyLen]byte
	encodeKey(&kb, k)
	var rb [recordLen]byte
	rec.encode(&rb)
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set(kb[:], rb[:]) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	seg := filepath.Join(dir, segDirName, segName(rec.seg))
	if err := os.Truncate(seg, rec.offset+rec.n); err != nil { // sparse: allocates nothing
		t.Fatal(err)
	}
	s2, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: 64 << 20, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	n, ok := s2.Size(k)
	before := s2.Stats()
	k2 := testKey(3, 1)
	_ = s2.Put(k2, payloadFor(k2, 4096))
	if ok && n > maxBlock {
		after := s2.Stats()
		t.Fatalf("reindex indexed a %d-byte block (MaxBlockBytes %d): Bytes %d > LogicalLimit %d; one 4 KiB Put then evicted %d blocks (%d left)",
			n, maxBlock, before.Bytes, before.LogicalLimit, after.Evictions, after.Blocks)
	}
}

// TestSyncMakesNewSegmentsDurable: a segment created since the last Sync
// has its directory entry fsynced by the next Sync (once), and at once
// under SyncWrites; before, a power loss could lose a synced segment's
// entry and so its records.
func TestSyncMakesNewSegmentsDurable(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), "nvme"), 64<<20)
	defer s.Close()
	k := testKey(1, 1)
	before := s.segs.dirSyncs.Load()
	if err := s.Put(k, payloadFor(k, 4096)); err != nil {
		t.Fatal(err)
	}
	if !s.segs.dirDirty.Load() {
		t.Fatal("a Put that created a segment left the directory clean")
	}
	for range 2 {
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.segs.dirSyncs.Load() - before; n != 1 {
		t.Fatalf("%d directory fsyncs for one new segment and two Syncs, want 1", n)
	}

	s2, err := Open(context.Background(), Options{Dir: filepath.Join(t.TempDir(), "nvme"), CapacityBytes: 64 << 20,
		SyncWrites: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.Put(k, payloadFor(k, 4096)); err != nil {
		t.Fatal(err)
	}
	if s2.segs.dirSyncs.Load() == 0 || s2.segs.dirDirty.Load() {
		t.Fatal("under SyncWrites a Put that created a segment returned before its directory entry was durable")
	}
}

// TestReindexDropsEveryDanglingRecord: an Open whose segments were lost
// finds every index record dangling and deletes them all, however many,
// on a filesystem with room: it deleted one round (maxVictimsPerPut) and
// kept the rest as if the filesystem were full.
func TestReindexDropsEveryDanglingRecord(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, 100<<20)
	const n = maxVictimsPerPut + 100
	var ks []Key
	var bs [][]byte
	for i := range uint64(n) {
		k := testKey(1, i)
		ks, bs = append(ks, k), append(bs, payloadFor(k, 64))
		if len(ks) == 64 || i == n-1 {
			if err := s.PutBatch(ks, bs); err != nil {
				t.Fatalf("put batch at %d: %v", i, err)
			}
			ks, bs = ks[:0], bs[:0]
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	segs, err := filepath.Glob(filepath.Join(dir, segDirName, "*"+segSuffix))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments: %v %v", segs, err)
	}
	for _, p := range segs {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	s = openT(t, dir, 100<<20)
	defer s.Close()
	if b := s.Stats().Blocks; b != 0 {
		t.Fatalf("%d blocks indexed with every segment lost", b)
	}
	left := 0
	if err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			left++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d dangling index records left in badger after the reopen, want 0", left)
	}
}
