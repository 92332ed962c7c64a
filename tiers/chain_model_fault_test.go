// Faults found by TestChainModel, each pinned down by a minimal test.

package tiers

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// fillParked fills the store with parked (unevictable) blocks of size
// bytes until a Put fails for lack of room, then deletes one of them: the
// store has room for one more block of that size, not for two.
func fillParked(t *testing.T, store *nvme.Store, size int64) {
	t.Helper()
	b := make([]byte, size)
	var last nvme.Key
	for i := uint64(1); ; i++ {
		k := nvme.Key{NS: 51 | ParkedNS, Hash: shm.Hash{Hi: 51, Lo: i}}
		err := store.Put(k, b)
		if errors.Is(err, nvme.ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatalf("fill: %v", err)
		}
		if i > 1000 {
			t.Fatal("the budget never filled")
		}
		last = k
	}
	if err := store.Delete(last); err != nil {
		t.Fatal(err)
	}
}

// TestDeleteWhileBatchPartlyWritten: a block deleted while the mover
// writes it down in a batch whose later chunk fails (disk full) stays in
// NVMe: the store kept the earlier chunks, Delete found no copy to remove
// yet, and the failed write did not check for deletes as a successful one
// does. The deleted block is read back; a parked one (a released request)
// is an unevictable orphan no TTL tracks.
func TestDeleteWhileBatchPartlyWritten(t *testing.T) {
	const bs = 600 << 10                            // one block per PutBatch chunk (1 MiB)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one writer: one batch
	var once sync.Once
	var victim Key
	var deleted bool
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		hook: func(op string, k Key) {
			if op == "put" {
				once.Do(func() { victim, deleted = k, r.c.Delete(k) }) // the first block of the batch
			}
		}})
	// Parked (unevictable): the failing chunk cannot evict the first one.
	a, b := chainKey(52|ParkedNS, 1), chainKey(52|ParkedNS, 2)
	r.putHost(t, a, bs)
	r.putHost(t, b, bs)
	fillParked(t, r.store, bs)
	if _, err := r.c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !deleted {
		t.Fatal("Delete found nothing")
	}
	if r.store.Contains(nk(victim)) {
		t.Fatalf("parked block released while written down is in NVMe after the batch failed (host %v, parked blocks %d): an unevictable orphan",
			r.h.Contains(victim), r.c.ParkedBlocks())
	}
	if _, ok := r.c.Acquire(victim, bs, func(hd *Handle, err error) {
		if hd != nil {
			r.h.Release(hd)
		}
	}); ok {
		t.Fatal("deleted block is a hit")
	}
}

// TestPromotionOfBlockDeletedWhileWrittenDown: a block deleted while the
// mover writes it down is visible in NVMe from the moment the store
// indexes it until the mover sees the delete and removes it; a promotion
// in that window copied the deleted block back into the host tier, where
// it stayed after its NVMe copy was removed.
func TestPromotionOfBlockDeletedWhileWrittenDown(t *testing.T) {
	const bs = 64 << 10
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one writer: one batch
	var puts, swapOuts atomic.Int32
	var victim atomic.Pointer[Key]
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20,
		cfg: ChainConfig{ObserveSwapOut: func(time.Duration) {
			// After the first block of the batch: both are indexed in
			// NVMe, the mover has not looked at the second one yet.
			if swapOuts.Add(1) != 1 || victim.Load() == nil {
				return
			}
			k := *victim.Load()
			hd, err := acquireWait(t, r.c, k, bs)
			if err == nil {
				r.h.Release(hd)
			}
		}},
		hook: func(op string, k Key) {
			if op == "put" && puts.Add(1) == 2 {
				if !r.c.Delete(k) { // the second block of the batch
					t.Errorf("Delete of %v found nothing", k)
				}
				victim.Store(&k)
			}
		}})
	r.putHost(t, chainKey(53, 1), bs)
	r.putHost(t, chainKey(53, 2), bs)
	if _, err := r.c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The deleted block is left out of the batch: one block written.
	if victim.Load() == nil || swapOuts.Load() != 1 {
		t.Fatalf("the batch did not run as planned: victim %v, %d blocks written", victim.Load(), swapOuts.Load())
	}
	k := *victim.Load()
	if r.inAny(k) {
		t.Fatalf("block deleted while written down is back after its write: host %v, nvme %v", r.h.Contains(k), r.store.Contains(nk(k)))
	}
}
