//go:build !cuda

package tiers

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/cudaipc"
)

// inFrame reports whether some goroutine's stack has a frame of fn.
func inFrame(fn string) bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), fn)
}

// A promotion host → GPU that starts after Delete's tombstone pass but pins
// the host copy before Delete reaches the host tier commits the block to the
// GPU after Delete already swept the GPUs: the deleted block comes back.
func TestGPUDeleteRacesPromotion(t *testing.T) {
	r := newGPURig(t, true)
	k := chainKey(40, 1)
	r.put(t, k, -1) // host only
	// Hold the chain's lock: Delete stops in Chain.Delete, after its
	// tombstone pass and its sweep of the GPU arenas, before the host tier.
	r.c.mu.Lock()
	deleted := make(chan bool, 1)
	go func() { deleted <- r.gs.Delete(k) }()
	waitFor(t, "Delete to reach the chain", func() bool { return inFrame("tiers.(*Chain).Delete(") })
	// A device reader on GPU 0 now: its promotion pins the host copy and
	// commits a GPU copy (it takes no chain lock), unless it has to wait
	// for the Delete (a fixed tier).
	type res struct {
		hd  *Handle
		err error
	}
	got := make(chan res, 1)
	go func() {
		hd, err := r.acquire(t, k, 0, true)
		got <- res{hd, err}
	}()
	var x res
	var early bool
	waitFor(t, "the promotion to finish or wait for the Delete", func() bool {
		select {
		case x = <-got:
			early = true
			return true
		default:
			return inFrame("tiers.(*GPUSet).track(")
		}
	})
	r.c.mu.Unlock()
	if !<-deleted {
		t.Fatal("delete found nothing")
	}
	if !early {
		x = <-got
	}
	if x.err == nil {
		x.hd.Owner().Release(x.hd)
	}
	r.checkGone(t, k, "Delete")
}

// The same for a demotion GPU → host: Delete's tombstone pass runs before
// the demoter tracks its copy, Delete's GPU sweep and host sweep run while
// the copy is in flight (the host holds only the demoter's reservation, which
// Delete skips), and the commit brings the deleted block back into the host
// tier.
func TestGPUDeleteRacesDemotion(t *testing.T) {
	r := newGPURig(t, false)
	g0, g1 := r.gs.GPUs[0], r.gs.GPUs[1]
	k := chainKey(41, 1)
	if at := r.put(t, k, 1); at != g1.Slots {
		t.Fatal("put did not land on GPU 1")
	}
	// Delete stops at its sweep of GPU 0 (k lives on GPU 1), after its
	// tombstone pass.
	g0.Slots.mu.Lock()
	var once sync.Once
	unlock := func() { once.Do(g0.Slots.mu.Unlock) }
	deleted := make(chan bool, 1)
	go func() { deleted <- r.gs.Delete(k) }()
	waitFor(t, "Delete to reach the GPU sweep", func() bool { return inFrame("tiers.(*Host).Delete(") })
	// The demoter has copied k into its host reservation: let Delete run to
	// its end before the commit.
	var res bool
	var waited bool
	r.gs.copied = func(Key) {
		unlock()
		res, waited = <-deleted, true
	}
	done := make(chan struct{})
	go func() {
		r.gs.demoteBatch(g1, 8)
		close(done)
	}()
	waitFor(t, "the demotion to copy or wait for the Delete", func() bool {
		select {
		case <-done:
			return true
		default:
			return inFrame("tiers.(*GPUSet).track(") || inFrame("tiers.(*GPUSet).commitCopy(")
		}
	})
	unlock()
	<-done
	if !waited {
		res = <-deleted
	}
	if !res {
		t.Fatal("delete found nothing")
	}
	r.checkGone(t, k, "Delete")
}

// A host reader of a GPU block that the demoter is writing down at that
// moment gets an error, not a lease: viaHost's writeDown finds the host slot
// reserved (by the demoter), returns no pin, and startMove's Pin of the
// still-reserved host copy fails. The block is cached all along (on the GPU,
// and in the host tier a moment later).
func TestGPUHostReadDuringDemotion(t *testing.T) {
	r := newGPURig(t, true)
	g0 := r.gs.GPUs[0]
	k := chainKey(42, 1)
	if at := r.put(t, k, 0); at != g0.Slots {
		t.Fatal("put did not land on GPU 0")
	}
	type res struct {
		hd  *Handle
		err error
	}
	got := make(chan res, 1)
	r.gs.copied = func(Key) {
		// The demoter holds k's host slot reserved, its copy done and its
		// commit next: a host reader comes now. Let the demoter commit once
		// the read was answered or waits for the demoter (a fixed tier).
		go func() {
			hd, err := r.acquire(t, k, -1, false)
			got <- res{hd, err}
		}()
		waitFor(t, "the read to be answered or to wait", func() bool {
			return len(got) > 0 || inFrame("tiers.(*GPUSet).viaHost(")
		})
	}
	r.gs.demoteBatch(g0, 8)
	r.gs.copied = nil
	x := <-got
	leased, err := x.hd, x.err
	if err != nil {
		t.Fatalf("host read of a cached block during its demotion: %v", err)
	}
	leased.Owner().Release(leased)
}

// DeleteNS: the tombstone pass runs before a promotion tracks its copy; the
// promotion pins the host copy before DeleteNS sweeps the host tier and
// commits to the GPU after DeleteNS swept the GPUs (which skip its
// reservation): the namespace's block comes back on the GPU.
func TestGPUDeleteNSRacesPromotion(t *testing.T) {
	r := newGPURig(t, true)
	k := chainKey(43, 1)
	r.put(t, k, -1) // host only
	r.c.mu.Lock()   // DeleteNS stops in Chain.DeleteNamespaces, after its tombstone pass
	var once sync.Once
	unlock := func() { once.Do(r.c.mu.Unlock) }
	deleted := make(chan int, 1)
	go func() { deleted <- r.gs.DeleteNS(k.NS) }()
	waitFor(t, "DeleteNS to reach the chain", func() bool { return inFrame("tiers.(*Chain).DeleteNamespaces(") })
	var n int
	var waited bool
	r.gs.copied = func(Key) { // the promotion copied k into its GPU reservation
		unlock()
		n, waited = <-deleted, true
	}
	type res struct {
		hd  *Handle
		err error
	}
	got := make(chan res, 1)
	go func() {
		hd, err := r.acquire(t, k, 0, true)
		got <- res{hd, err}
	}()
	waitFor(t, "the promotion to copy or wait for DeleteNS", func() bool {
		return len(got) > 0 || inFrame("tiers.(*GPUSet).track(") || inFrame("tiers.(*GPUSet).commitCopy(")
	})
	unlock()
	x := <-got
	if !waited {
		n = <-deleted
	}
	if x.err == nil {
		x.hd.Owner().Release(x.hd)
	}
	if n != 1 {
		t.Fatalf("DeleteNS removed %d blocks", n)
	}
	r.checkGone(t, k, "DeleteNS")
}

// TestGPUWaitRunsHandedOffMoves: moves handed to a full job queue by a
// goroutine are run by Wait, also when that goroutine sends after Wait
// found the queue empty, and a move asked for after Wait fails at once:
// every waiter is answered exactly once.
func TestGPUWaitRunsHandedOffMoves(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // the handoff runs late
	r := newGPURig(t, false)
	r.gs.jobs = make(chan func(), 1)
	keys := []Key{chainKey(44, 1), chainKey(44, 2), chainKey(44, 3)}
	for _, k := range keys {
		r.put(t, k, -1) // host only: a device read promotes it
	}
	answers := make(chan error, len(keys)+1)
	for _, k := range keys {
		hd, ok := r.gs.Acquire(k, gpuBlock, 0, true, func(hd *Handle, err error) {
			if hd != nil {
				hd.Owner().Release(hd)
			}
			answers <- err
		})
		if hd != nil || !ok {
			t.Fatalf("acquire %v: want a deferred move", k)
		}
	}
	r.gs.Wait() // no workers: Wait runs the queue
	for i := range keys {
		select {
		case err := <-answers:
			if err != nil {
				t.Errorf("move %d: %v", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d waiters never answered after Wait", len(keys)-i, len(keys))
		}
	}
	late := chainKey(44, 4)
	r.put(t, late, -1)
	if hd, ok := r.gs.Acquire(late, gpuBlock, 0, true, func(_ *Handle, err error) { answers <- err }); hd != nil || !ok {
		t.Fatal("acquire after Wait: want a deferred answer")
	}
	select {
	case err := <-answers:
		if err == nil {
			t.Fatal("a move after Wait succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a move asked for after Wait was never answered")
	}
}

// Reserve scans the GPU arenas one after another. A migration GPU 2 → GPU 0
// that completes (commit on GPU 0, source dropped from GPU 2) after the
// scan passed GPU 0 and before it reaches GPU 2 is missed: Reserve hands out
// a second reservation of a block that is committed on GPU 0.
func TestGPUReserveRacesMigration(t *testing.T) {
	r := newGPURigN(t, 3, false)
	g0, g1, g2 := r.gs.GPUs[0], r.gs.GPUs[1], r.gs.GPUs[2]
	k := chainKey(60, 1)
	if at := r.put(t, k, 2); at != g2.Slots {
		t.Fatal("put did not land in GPU 2")
	}
	// Stall Reserve's scan at GPU 1 (stands for the scheduler preempting it
	// between two Present calls).
	g1.Slots.mu.Lock()
	type res struct {
		hd  *Handle
		err error
	}
	rc := make(chan res, 1)
	go func() {
		hd, err := r.gs.Reserve(k, gpuBlock, -1)
		rc <- res{hd, err}
	}()
	waitFor(t, "Reserve to stall at GPU 1", func() bool { return inFrame("tiers.(*Host).Present(") })
	// A device reader on GPU 0 migrates the block from GPU 2 (the mover's
	// job, as Acquire's startMove runs it).
	mc := make(chan error, 1)
	go func() {
		at, held, err := r.gs.migrate(g2, g0, k, gpuBlock)
		if err == nil {
			at.Unpin(held, false)
		}
		mc <- err
	}()
	var merr error
	migrated := false
	waitFor(t, "the migration to finish or wait", func() bool {
		select {
		case merr = <-mc:
			migrated = true
			return true
		default:
			return inFrame("tiers.(*GPUSet).commitCopy(")
		}
	})
	g1.Slots.mu.Unlock()
	x := <-rc
	if !migrated {
		merr = <-mc
	}
	if merr != nil {
		t.Fatalf("migrate: %v", merr)
	}
	if x.err == nil {
		owner := "host"
		if g := r.gs.GPUOf(x.hd); g != nil {
			owner = "a GPU"
		}
		x.hd.Owner().Abort(x.hd)
		t.Fatalf("Reserve of a block committed on GPU 0 (migrated during the scan) succeeded (reservation in %s), want ErrExists", owner)
	}
	if !errors.Is(x.err, ErrExists) {
		t.Fatalf("Reserve: %v, want ErrExists", x.err)
	}
	if !g0.Slots.Contains(k) && !g2.Slots.Contains(k) {
		t.Fatal("block lost")
	}
}

// DeleteNS reports how many blocks a namespace evict removed (the daemon
// answers the operator's evict with it). Blocks that live on different GPUs,
// or on a GPU and only in the host tier, are distinct blocks, but GPUSet
// takes the max of the per-tier counts.
func TestGPUDeleteNSCount(t *testing.T) {
	r := newGPURig(t, true)
	const ns = 61
	r.put(t, chainKey(ns, 1), 0)  // GPU 0 only
	r.put(t, chainKey(ns, 2), 1)  // GPU 1 only
	r.put(t, chainKey(ns, 3), -1) // host only
	if n := r.gs.DeleteNS(ns); n != 3 {
		t.Fatalf("DeleteNS removed 3 distinct blocks, reported %d", n)
	}
	// A block with copies in two tiers is one block.
	k := chainKey(ns, 4)
	r.put(t, k, -1)
	hd, err := r.acquire(t, k, 0, true) // promote: host + GPU 0
	if err != nil || hd.Owner() != r.gs.GPUs[0].Slots {
		t.Fatalf("promotion: %v", err)
	}
	hd.Owner().Release(hd)
	if n := r.gs.DeleteNS(ns); n != 1 {
		t.Fatalf("DeleteNS of one block with two copies reported %d", n)
	}
}

// failDtoD fails device-to-device copies while fail is set.
type failDtoD struct {
	cudaipc.Device
	fail atomic.Bool
}

func (d *failDtoD) CopyDtoDAsync(dst, src cudaipc.DevicePtr, n int64, s cudaipc.Stream) error {
	if d.fail.Load() {
		return errors.New("injected D2D failure")
	}
	return d.Device.CopyDtoDAsync(dst, src, n, s)
}

// A compaction copy that fails is counted (CompactErrors) but the allocator
// moves the block's offset anyway: the block stays committed, pointing at a
// slot that was never written (here: the bytes of another, deleted block).
// Readers are then served wrong bytes.
func TestGPUCompactionCopyFailure(t *testing.T) {
	r := newGPURig(t, false)
	g0 := r.gs.GPUs[0]
	keys, deleted, compact := failingCompaction(t, r, 62)
	compact()
	if st := r.gs.Stats(); st.CompactErrors == 0 {
		t.Fatal("no compaction copy failed: the test did not compact")
	}
	bad := 0
	for _, k := range keys {
		if deleted[k] {
			continue
		}
		b, ok := r.read(t, g0.Slots, k)
		if ok && !bytes.Equal(b, blockFor(k, gpuBlock)) {
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d committed GPU blocks hold wrong bytes after a failed compaction copy", bad)
	}
}

// failingCompaction fills GPU 0's arena of r with blocks of namespace ns (8
// slabs of 4 blocks) and deletes one block in each of slabs 0..3, so that
// the class holds a slab's worth of free slots: a reservation of another
// class then compacts (drains a slab). compact makes that reservation (and
// aborts it) with every device-to-device copy failing.
func failingCompaction(t *testing.T, r *gpuRig, ns uint32) (keys []Key, deleted map[Key]bool, compact func()) {
	t.Helper()
	g0 := r.gs.GPUs[0]
	fd := &failDtoD{Device: g0.Dev}
	g0.Dev = fd
	t.Cleanup(func() { g0.Dev = fd.Device })
	for i := range uint64(32) { // 8 slabs of 4 blocks: the arena is full
		k := chainKey(ns, i)
		hd, err := g0.Slots.Reserve(k, gpuBlock)
		if err != nil {
			t.Fatal(err)
		}
		b := blockFor(k, gpuBlock)
		if err := g0.run(func(s cudaipc.Stream) error { return g0.Dev.CopyHtoDAsync(g0.ptr(hd.Offset), b, s) }); err != nil {
			t.Fatal(err)
		}
		if err := g0.Slots.Commit(hd); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	deleted = map[Key]bool{}
	for _, i := range []int{0, 4, 8, 12} {
		if !g0.Slots.Delete(keys[i]) {
			t.Fatal("delete")
		}
		deleted[keys[i]] = true
	}
	compact = func() {
		t.Helper()
		fd.fail.Store(true)
		hd, err := g0.Slots.Reserve(chainKey(ns, 100), 2*gpuBlock)
		fd.fail.Store(false)
		if err != nil {
			t.Fatalf("reserve of another class: %v", err)
		}
		g0.Slots.Abort(hd)
	}
	return keys, deleted, compact
}

// TestGPUDemotionKeepsCopyOverHostReservation: a GPU block whose key the
// host tier holds only reserved (a promotion from NVMe being written) is
// not dropped by the demoter: if that reservation aborts, the GPU copy is
// the block's last one (it used to be dropped as if the host held it).
func TestGPUDemotionKeepsCopyOverHostReservation(t *testing.T) {
	r := newGPURig(t, false)
	g0 := r.gs.GPUs[0]
	k := chainKey(63, 1)
	if at := r.put(t, k, 0); at != g0.Slots {
		t.Fatal("put did not land on GPU 0")
	}
	res, err := r.h.Reserve(k, gpuBlock) // another writer of k in the host tier
	if err != nil {
		t.Fatal(err)
	}
	if moved, failed := r.gs.demoteBatch(g0, 8); moved != 0 || failed != 0 {
		t.Fatalf("demotion over a host reservation: moved %d, failed %d; want 0, 0 (keep it, try later)", moved, failed)
	}
	if !g0.Slots.Contains(k) {
		t.Fatal("the GPU copy was dropped while the host held k only reserved")
	}
	r.h.Abort(res) // the other writer fails
	if moved, _ := r.gs.demoteBatch(g0, 8); moved != 1 || !r.h.Contains(k) || g0.Slots.Contains(k) {
		t.Fatalf("demotion after the abort: moved %d, host %v, gpu %v", moved, r.h.Contains(k), g0.Slots.Contains(k))
	}
	if b, ok := r.read(t, r.h, k); !ok || !bytes.Equal(b, blockFor(k, gpuBlock)) {
		t.Fatal("the demoted block reads back wrong")
	}
}

// checkGone reports each tier that still holds k after op returned.
func (r *gpuRig) checkGone(t *testing.T, k Key, op string) {
	t.Helper()
	for i, g := range r.gs.GPUs {
		if g.Slots.Present(k) {
			t.Errorf("gpu %d still holds the block after %s returned", i, op)
		}
	}
	if r.h.Present(k) {
		t.Errorf("host still holds the block after %s returned", op)
	}
}
