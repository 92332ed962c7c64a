// Races between the mover and deletes, leases and shutdown.

package tiers

import (
	"bytes"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/policy"
)

// TestDeleteWhileWrittenDownThenReput: a block deleted (Chain.Delete) while the
// demoter has it pinned and is writing it down must not come back in NVMe;
// and a block re-put under the same key after the delete must not be
// shadowed by the old bytes once it is demoted.
func TestDeleteWhileWrittenDownThenReput(t *testing.T) {
	const bs = 256 << 10
	victim := chainKey(40, 0)
	var once sync.Once
	var deleted, hooked atomic.Bool
	var r *chainRig
	newBytes := bytes.Repeat([]byte{0xBB}, bs)
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{HighWatermark: 0.5, LowWatermark: 0.25, Policy: "lru"},
		hook: func(op string, k Key) {
			if op != "put" || k != victim {
				return
			}
			once.Do(func() {
				// A session deletes the block while the demoter writes it...
				deleted.Store(r.c.Delete(victim))
				// ...and puts new bytes under the same key.
				hd, err := r.c.Reserve(victim, bs)
				if err != nil {
					t.Errorf("re-put after delete: %v", err)
					return
				}
				copy(r.h.Bytes(hd), newBytes)
				if err := r.h.Commit(hd); err != nil {
					t.Error(err)
				}
				r.c.Inserted(victim, policy.AccessInfo{})
			})
			hooked.Store(true)
		}})
	for i := range 10 { // 10 of 16 slots: above high (8)
		r.putHost(t, chainKey(40, uint64(i)), bs)
	}
	r.start()
	eventually(t, 10*time.Second, "the victim was never written down", hooked.Load)
	r.c.demoteMu.Lock() // the batch that wrote the victim is over
	if !deleted.Load() {
		t.Fatal("Delete found nothing")
	}
	// The host holds the new bytes; NVMe must not hold the deleted ones.
	if r.store.Contains(nk(victim)) {
		dst := make([]byte, bs)
		r.store.Get(nk(victim), dst)
		t.Errorf("after Delete + re-put, NVMe holds a copy (old bytes: %v) that the chain treats as a clean copy of the host block",
			bytes.Equal(dst, blockFor(victim, bs)))
	}
	// Demote everything: the reader must get the new bytes.
	for r.c.demoteBatch(16) > 0 {
	}
	r.c.demoteMu.Unlock()
	hd, err := acquireWait(t, r.c, victim, bs)
	if err != nil {
		t.Fatalf("acquire after demotion: %v", err)
	}
	defer r.h.Release(hd)
	if !bytes.Equal(r.h.Bytes(hd), newBytes) {
		t.Fatalf("read back the DELETED bytes (old block: %v) instead of the re-put block",
			bytes.Equal(r.h.Bytes(hd), blockFor(victim, bs)))
	}
}

// TestDeleteWhileWrittenDown: without a re-put, a block deleted
// while the demoter writes it reappears in NVMe after Delete returned true.
func TestDeleteWhileWrittenDown(t *testing.T) {
	const bs = 256 << 10
	victim := chainKey(41, 0)
	var once sync.Once
	done := make(chan bool, 1)
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{HighWatermark: 0.5, LowWatermark: 0.25, Policy: "lru"},
		hook: func(op string, k Key) {
			if op == "put" && k == victim {
				once.Do(func() { done <- r.c.Delete(victim) })
			}
		}})
	for i := range 10 {
		r.putHost(t, chainKey(41, uint64(i)), bs)
	}
	r.start()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("Delete found nothing")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("victim never written down")
	}
	eventually(t, 10*time.Second, "pass did not finish", func() bool {
		used, c := r.h.Usage()
		return used <= c/4
	})
	if r.inAny(victim) {
		t.Fatalf("deleted block is back: host %v nvme %v", r.h.Contains(victim), r.store.Contains(nk(victim)))
	}
}

// TestPromotedBlockHeldUntilLeased: copyUp commits the promoted block
// unpinned and finish pins it only later; a demoter pass in between takes
// the fresh block and the waiter gets ErrPromote for a cached block.
func TestPromotedBlockHeldUntilLeased(t *testing.T) {
	const bs = 256 << 10
	k := chainKey(42, 1)
	var r *chainRig
	var once sync.Once
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		// One block (256 KiB of 4 MiB) is above high: the demoter runs.
		cfg: ChainConfig{HighWatermark: 0.05, LowWatermark: 0.01, Policy: "lru",
			ObserveSwapIn: func(time.Duration) {
				// The promotion worker is descheduled right after Commit,
				// before finish pins the block; the demoter runs meanwhile.
				once.Do(func() {
					r.c.kickDemoter()
					deadline := time.Now().Add(500 * time.Millisecond)
					for r.h.Contains(k) && time.Now().Before(deadline) {
						time.Sleep(time.Millisecond)
					}
				})
			}}})
	r.putNVMe(t, k, bs)
	r.start()
	hd, err := acquireWait(t, r.c, k, bs)
	if err != nil {
		t.Fatalf("promotion of a block cached in NVMe failed: %v", err)
	}
	r.h.Release(hd)
}

// TestVictimLeasedWhileWrittenStaysTracked: a victim leased by a reader
// while the demoter writes it stays in the host tier, but the policy has
// forgotten it (polKeys) for good.
func TestVictimLeasedWhileWrittenStaysTracked(t *testing.T) {
	const bs = 256 << 10
	victim := chainKey(43, 0)
	var once sync.Once
	var held atomic.Pointer[Handle]
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{HighWatermark: 0.5, LowWatermark: 0.25, Policy: "lru"},
		hook: func(op string, k Key) {
			if op == "put" && k == victim {
				once.Do(func() { hd, _ := r.h.Acquire(victim); held.Store(hd) }) // a reader leases it meanwhile
			}
		}})
	for i := range 7 { // below high: the demoter stays idle
		r.putHost(t, chainKey(43, uint64(i)), bs)
	}
	r.start()
	eventually(t, 5*time.Second, "policy did not see the inserts", func() bool {
		r.c.pmu.Lock()
		defer r.c.pmu.Unlock()
		return len(r.c.polKeys) == 7
	})
	for i := 7; i < 10; i++ { // now above high
		r.putHost(t, chainKey(43, uint64(i)), bs)
	}
	eventually(t, 10*time.Second, "pass did not finish", func() bool {
		used, c := r.h.Usage()
		return held.Load() != nil && used <= c/4
	})
	r.h.Release(held.Load())
	r.c.Accessed(victim, policy.AccessInfo{})
	if !r.h.Contains(victim) {
		t.Fatal("victim left the host tier")
	}
	eventually(t, 10*time.Second, "the host-resident victim to be known to the policy again", func() bool {
		r.c.pmu.Lock() // policyLoop applies the events
		defer r.c.pmu.Unlock()
		_, known := r.c.polKeys[pk(victim)]
		return known
	})
}

// TestWaitFailsHandedOffPromotions: a demand promotion whose queue send
// falls back to a goroutine while the chain is stopping is never answered
// when that goroutine sends after Wait drained the queue.
func TestWaitFailsHandedOffPromotions(t *testing.T) {
	const bs = 64 << 10
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r := newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20,
		cfg: ChainConfig{PromoteWorkers: 1, PromoteQueue: 1}})
	k1, k2 := chainKey(44, 1), chainKey(44, 2)
	r.putNVMe(t, k1, bs)
	r.putNVMe(t, k2, bs)
	r.cancel()
	r.c.wg.Wait() // the mover has stopped; sessions may still be finishing
	called := make(chan error, 2)
	cb := func(hd *Handle, err error) {
		if hd != nil {
			r.h.Release(hd)
		}
		called <- err
	}
	if hd, ok := r.c.Acquire(k1, bs, cb); hd != nil || !ok {
		t.Fatal("acquire k1")
	}
	if hd, ok := r.c.Acquire(k2, bs, cb); hd != nil || !ok { // queue full: goroutine fallback
		t.Fatal("acquire k2")
	}
	r.c.Wait() // fails what is queued, returns
	for i := range 2 {
		select {
		case <-called:
		case <-time.After(2 * time.Second):
			r.c.mu.Lock()
			n := len(r.c.inflight)
			r.c.mu.Unlock()
			t.Fatalf("waiter %d never called after Wait returned (inflight entries left: %d, queued: %d)", i, n, len(r.c.promoCh))
		}
	}
}

// TestReleasedParkedBlockNotLeftByFlush: a parked request released
// (Chain.Delete) while a runtime Flush writes its block, before the
// write-through got to it, leaves an unevictable parked block in NVMe that
// no TTL tracks: it never expires (until a restart re-registers it).
func TestReleasedParkedBlockNotLeftByFlush(t *testing.T) {
	const bs = 64 << 10
	const ttl = 200 * time.Millisecond
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one write-through goroutine
	blocker := Key{NS: 9 | ParkedNS, Hash: chainKey(45, 1).Hash}
	target := Key{NS: 9 | ParkedNS, Hash: chainKey(45, 2).Hash}
	var flushing atomic.Bool
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20,
		cfg: ChainConfig{ParkTTL: ttl},
		hook: func(op string, k Key) {
			switch {
			case op != "put":
			case k == blocker && !flushing.Load(): // the write-through is busy (slow disk)
				entered <- struct{}{}
				<-gate
			case k == target && flushing.Load():
				once.Do(func() { r.c.Delete(target) }) // the request is released
			}
		}})
	r.putHost(t, blocker, bs)
	<-entered
	r.putHost(t, target, bs) // queued behind the blocker
	flushing.Store(true)
	if _, err := r.c.Flush(t.Context()); err != nil { // e.g. kvtierctl flush
		t.Fatal(err)
	}
	flushing.Store(false)
	close(gate)
	time.Sleep(5 * ttl) // well past the TTL: expireLoop ran
	if n := r.c.ParkedBlocks(); n != 0 {
		t.Fatalf("parked blocks %d", n)
	}
	if r.inAny(target) {
		t.Fatalf("released parked block still stored (host %v, nvme %v) past the TTL, untracked: an unevictable orphan",
			r.h.Contains(target), r.store.Contains(nk(target)))
	}
}

// TestRefusedQueueBounded: refused blocks that leave the host tier by
// Delete keep their entry in c.unadmitted, which is only trimmed by a
// demotion pass (above the high watermark): below it, put/delete churn of
// refused blocks grows the queue without bound.
func TestRefusedQueueBounded(t *testing.T) {
	const bs = 64 << 10
	r := newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, cfg: ChainConfig{Policy: "chain"}})
	orphan := policy.AccessInfo{HasParent: true, Parent: pk(chainKey(46, 999999))} // parent unknown: refused
	k := chainKey(46, 1)
	for range 5000 {
		hd, err := r.c.Reserve(k, bs)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.h.Commit(hd); err != nil {
			t.Fatal(err)
		}
		r.c.Inserted(k, orphan)
		time.Sleep(20 * time.Microsecond)
		r.c.Delete(k)
	}
	time.Sleep(200 * time.Millisecond)
	r.c.pmu.Lock()
	n, set := len(r.c.unadmitted), len(r.c.unadmittedSet)
	r.c.pmu.Unlock()
	if used, _ := r.h.Usage(); used != 0 {
		t.Fatalf("host tier not empty: %d", used)
	}
	if n > 200 { // bounded by a small constant, not by the churn
		t.Fatalf("host tier empty, but the refused queue holds %d entries (set %d)", n, set)
	}
}

// TestDeleteDuringPromotionRead: a block deleted after a promotion read
// its bytes from NVMe, but before the promotion committed them to the
// host tier, stays deleted: the waiter gets an error, and no tier holds
// the block afterwards.
func TestDeleteDuringPromotionRead(t *testing.T) {
	const bs = 64 << 10
	k := chainKey(47, 1)
	deleted := make(chan bool, 1)
	var once sync.Once
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		hook: func(op string, key Key) {
			if op == "read" && key == k {
				once.Do(func() { deleted <- r.c.Delete(k) })
			}
		}})
	r.putNVMe(t, k, bs)
	r.start()
	if hd, err := acquireWait(t, r.c, k, bs); err == nil {
		r.h.Release(hd)
		t.Fatal("a block deleted during its promotion was leased")
	}
	if !<-deleted {
		t.Fatal("Delete found nothing")
	}
	if r.inAny(k) {
		t.Fatalf("deleted block is back: host %v nvme %v", r.h.Contains(k), r.store.Contains(nk(k)))
	}
	if n := r.c.Stats().PromoteLost; n != 1 {
		t.Fatalf("PromoteLost = %d, want 1", n)
	}
}

// TestRefusedLeasedStaysTracked: a refused block that a demotion pass pops
// while a client holds a lease on it (an orphan whose parent is in NVMe is
// still reachable by Lookup) goes back on the refused queue. pinVictims used
// to forget it: in neither the policy nor the queue, no later pass picked
// it while the policy had any victim.
func TestRefusedLeasedStaysTracked(t *testing.T) {
	const bs = 64 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true, cfg: ChainConfig{Policy: "chain"}})
	c, h := r.c, r.h
	head := Key{NS: 1, Hash: shm.Hash{Hi: 1, Lo: 1}}
	orphan := Key{NS: 1, Hash: shm.Hash{Hi: 2, Lo: 2}}
	missingParent := Key{NS: 1, Hash: shm.Hash{Hi: 3, Lo: 3}}
	for _, k := range []Key{head, orphan} {
		hd, err := c.Reserve(k, bs)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Commit(hd); err != nil {
			t.Fatal(err)
		}
	}
	c.pmu.Lock()
	c.apply(polEvent{op: polInsert, k: pk(head), a: ChainInfo([]Key{head}, 0, 1, 0)})
	c.apply(polEvent{op: polInsert, k: pk(orphan), a: ChainInfo([]Key{missingParent, orphan}, 1, 2, 0)})
	c.pmu.Unlock()

	lease, ok := h.Acquire(orphan) // a reader holds the refused block
	if !ok {
		t.Fatal("acquire")
	}
	c.demoteMu.Lock()
	hs, drop, _ := c.pinVictims(1) // pops the refused block, cannot pin it; takes head instead
	c.demoteMu.Unlock()
	for _, hd := range hs {
		h.Unpin(hd, false)
	}
	if err := h.Release(lease); err != nil {
		t.Fatal(err)
	}
	// Drain what pinVictims queued for the policy.
	c.pmu.Lock()
	for len(c.polCh) > 0 {
		c.apply(<-c.polCh)
	}
	_, inPol := c.polKeys[pk(orphan)]
	_, inRefused := c.unadmittedSet[pk(orphan)]
	c.pmu.Unlock()
	t.Logf("pinVictims returned %d handles (%d refused); orphan resident %v, tracked by policy %v, in unadmitted queue %v", len(hs), drop, h.Contains(orphan), inPol, inRefused)
	if h.Contains(orphan) && !inPol && !inRefused {
		t.Fatal("a refused block leased during a demotion pass is resident but no longer tracked: the mover will not pick it while the policy has victims")
	}
}

// TestDeleteRacesLatePromotion: a promotion registered while a Delete of
// its block is in progress (after the Delete marked the promotions then in
// flight), whose NVMe read lands before the Delete's NVMe step, must not
// commit the deleted block back into the host tier.
func TestDeleteRacesLatePromotion(t *testing.T) {
	const bs = 4 << 10
	r := newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20})
	back := 0
	for i := range 3000 {
		k := chainKey(70, uint64(i))
		r.putNVMe(t, k, bs)
		var wg sync.WaitGroup
		wg.Add(2)
		var deleted bool
		got := make(chan *Handle, 1)
		go func() {
			defer wg.Done()
			deleted = r.c.Delete(k)
		}()
		go func() {
			defer wg.Done()
			hd, ok := r.c.Acquire(k, bs, func(hd *Handle, err error) { got <- hd })
			if !ok {
				got <- nil
			} else if hd != nil {
				got <- hd
			}
		}()
		wg.Wait()
		if hd := <-got; hd != nil {
			r.h.Release(hd)
		}
		if deleted && r.inAny(k) {
			back++
			t.Logf("iteration %d: Delete returned true, yet host %v nvme %v", i, r.h.Contains(k), r.store.Contains(nk(k)))
		}
	}
	if back > 0 {
		t.Fatalf("%d deleted blocks came back", back)
	}
}

// TestDeleteNSCountsDistinctBlocks: a namespace's blocks in the host tier
// only, in NVMe only, and in both (a promoted block keeps its clean copy
// below) are counted once each (the count was the larger tier's).
func TestDeleteNSCountsDistinctBlocks(t *testing.T) {
	const bs = 64 << 10
	r := newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20})
	hostOnly, nvmeOnly, both := chainKey(71, 1), chainKey(71, 2), chainKey(71, 3)
	r.putHost(t, hostOnly, bs)
	r.putNVMe(t, nvmeOnly, bs)
	r.putNVMe(t, both, bs)
	hd, err := acquireWait(t, r.c, both, bs) // promoted: host and NVMe
	if err != nil {
		t.Fatal(err)
	}
	r.h.Release(hd)
	if !r.h.Contains(both) || !r.store.Contains(nk(both)) {
		t.Fatal("the promoted block is not in both tiers")
	}
	if n := r.c.DeleteNS(71); n != 3 {
		t.Fatalf("DeleteNS of 3 distinct blocks reported %d", n)
	}
	for _, k := range []Key{hostOnly, nvmeOnly, both} {
		if r.inAny(k) {
			t.Fatalf("%v left after DeleteNS", k)
		}
	}
}

// TestAcquireJoiningDeletedPromotion: an acquire of a block that is in
// NVMe joined any promotion of its key in flight, even one a Delete had
// marked: the block deleted and put again, the acquire got the deleted
// generation's failure (a miss) although the block was cached.
func TestAcquireJoiningDeletedPromotion(t *testing.T) {
	const bs = 64 << 10
	k := chainKey(48, 1)
	type res struct {
		hd  *Handle
		err error
	}
	second := make(chan res, 1)
	var once sync.Once
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		hook: func(op string, key Key) {
			if op != "get" || key != k {
				return
			}
			once.Do(func() {
				// Before the promotion reads: delete the block, put it
				// again, and acquire the new one.
				if !r.c.Delete(k) {
					t.Error("Delete found nothing")
				}
				r.putNVMe(t, k, bs)
				hd, ok := r.c.Acquire(k, bs, func(hd *Handle, err error) { second <- res{hd, err} })
				if !ok || hd != nil {
					t.Errorf("acquire of the block put again: %v %v, want a promotion", hd, ok)
				}
			})
		}})
	r.putNVMe(t, k, bs)
	r.start()
	if hd, err := acquireWait(t, r.c, k, bs); err == nil {
		r.h.Release(hd) // a lease of the new generation is fine too
	}
	select {
	case got := <-second:
		if got.err != nil {
			t.Fatalf("acquire of a block put again after a delete: %v", got.err)
		}
		if !bytes.Equal(r.h.Bytes(got.hd), blockFor(k, bs)) {
			t.Fatal("wrong bytes")
		}
		r.h.Release(got.hd)
	case <-time.After(10 * time.Second):
		t.Fatal("the second acquire was never answered")
	}
}

// TestDeletedWhileWrittenDownNeverVisible: a block deleted while a
// write-down of it is in flight must not be seen in NVMe after Delete
// returned. writeDown used to store it and remove it only after the batch
// returned: in between, a Lookup hit it (and prefetched it) and a put of the
// key was refused as a duplicate.
func TestDeletedWhileWrittenDownNeverVisible(t *testing.T) {
	const bs = 64 << 10
	a, b := chainKey(50, 1), chainKey(50, 2)
	var deleted bool
	var seen []string
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		hook: func(op string, k Key) {
			if op == "put" && k == b {
				deleted = r.c.Delete(b) // before the batch is written
			}
		},
		cfg: ChainConfig{ObserveSwapOut: func(time.Duration) {
			// Between the batch's blocks: a's copy is done, b's delete
			// returned long ago.
			tiers := make([]shm.Tier, 1)
			if hits, _ := r.c.Lookup([]Key{b}, tiers); hits != 0 {
				seen = append(seen, "Lookup hit")
			}
			if r.store.Contains(nk(b)) {
				seen = append(seen, "NVMe holds it")
			}
		}}})
	r.putHost(t, a, bs)
	r.putHost(t, b, bs)
	var run []*Handle
	for _, k := range []Key{a, b} {
		hd, ok := r.h.Pin(k)
		if !ok {
			t.Fatalf("pin %v", k)
		}
		run = append(run, hd)
	}
	ok, _, _, _ := r.c.writeDown(run)
	for _, hd := range run {
		r.h.Unpin(hd, false)
	}
	if !deleted {
		t.Fatal("Delete found nothing")
	}
	if !ok[0] {
		t.Fatal("the live block was not written down")
	}
	if len(seen) > 0 {
		t.Fatalf("after Delete returned, the deleted block was back while its write-down finished: %v", seen)
	}
	if r.inAny(b) {
		t.Fatalf("deleted block is back: host %v nvme %v", r.h.Contains(b), r.store.Contains(nk(b)))
	}
	r.checkNVMeBytes(t, a, bs)
}

// TestOldWriteDownKeepsNewerGeneration: a write-down that finds its block
// deleted must not remove a newer generation of the key that another
// writer (parkLoop, Flush beside the demoter) stored meanwhile. writeDown
// used to call NVMe.Delete(key) after its batch, and the re-put block was
// lost from every tier.
func TestOldWriteDownKeepsNewerGeneration(t *testing.T) {
	const bs = 64 << 10
	k := chainKey(49, 1)
	newBytes := bytes.Repeat([]byte{0xBB}, bs)
	var fired bool
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		hook: func(op string, key Key) {
			if op != "put" || key != k || fired {
				return
			}
			fired = true
			// Before the old generation's batch is written: it is deleted,
			// put again, and the new generation written down by another
			// writer, which drops it from the host tier.
			if !r.c.Delete(k) {
				t.Error("delete found nothing")
			}
			hd, err := r.c.Reserve(k, bs)
			if err != nil {
				t.Errorf("re-put after delete: %v", err)
				return
			}
			copy(r.h.Bytes(hd), newBytes)
			if err := r.h.Commit(hd); err != nil {
				t.Error(err)
				return
			}
			h2, ok := r.h.Pin(k)
			if !ok {
				t.Error("pin of the new generation")
				return
			}
			if ok2, _, _, _ := r.c.writeDown([]*Handle{h2}); !ok2[0] {
				t.Error("write-down of the new generation failed")
			}
			if dropped, _ := r.h.Unpin(h2, true); !dropped {
				t.Error("the new generation stayed in the host tier")
			}
		}})
	r.putHost(t, k, bs)
	h1, ok := r.h.Pin(k)
	if !ok {
		t.Fatal("pin")
	}
	r.c.writeDown([]*Handle{h1})
	r.h.Unpin(h1, true)
	if !fired {
		t.Fatal("the old generation was not written down")
	}
	if !r.store.Contains(nk(k)) {
		t.Fatalf("the block put again after the delete is lost: host %v nvme %v", r.h.Contains(k), r.store.Contains(nk(k)))
	}
	dst := make([]byte, bs)
	if n, err := r.store.Get(nk(k), dst); err != nil || n != bs || !bytes.Equal(dst, newBytes) {
		t.Fatalf("NVMe copy: %d bytes, %v, new generation's bytes %v", n, err, bytes.Equal(dst, newBytes))
	}
}

// TestPutAfterDeleteDuringPromotion: a block deleted while a promotion
// holds a host reservation for it can be put again at once. Reserve used to
// find the promotion's reservation, doomed by the delete, and answer
// ErrExists: the put was dropped as a duplicate of a block no tier held.
func TestPutAfterDeleteDuringPromotion(t *testing.T) {
	const bs = 64 << 10
	k := chainKey(51, 1)
	newBytes := bytes.Repeat([]byte{0xCD}, bs)
	var deleted bool
	var putErr error
	var once sync.Once
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		hook: func(op string, key Key) {
			if op != "get" || key != k {
				return
			}
			once.Do(func() {
				// The promotion holds its host reservation and is about to
				// read: a session deletes the block and puts it again.
				deleted = r.c.Delete(k)
				hd, err := r.c.Reserve(k, bs)
				if putErr = err; err != nil {
					return
				}
				copy(r.h.Bytes(hd), newBytes)
				putErr = r.h.Commit(hd)
			})
		}})
	r.putNVMe(t, k, bs)
	r.start()
	if hd, err := acquireWait(t, r.c, k, bs); err == nil {
		r.h.Release(hd)
	}
	if !deleted {
		t.Fatal("Delete found nothing")
	}
	if putErr != nil {
		t.Fatalf("put after the delete returned: %v", putErr)
	}
	hd, ok := r.h.Acquire(k)
	if !ok {
		t.Fatal("the block put after the delete is not in the host tier")
	}
	defer r.h.Release(hd)
	if !bytes.Equal(r.h.Bytes(hd), newBytes) {
		t.Fatalf("host holds other bytes than the put's (the deleted block's: %v)", bytes.Equal(r.h.Bytes(hd), blockFor(k, bs)))
	}
	eventually(t, 5*time.Second, "the promotion's reservation was not given up", func() bool { return r.h.Stats().Reserved == 0 })
}
