//go:build !cuda

package tiers

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// gpuOverChainRig puts one emulated GPU of gpuArena bytes over r's chain.
func gpuOverChainRig(t *testing.T, r *chainRig, arena []byte) *GPUSet {
	t.Helper()
	t.Setenv(cudaipc.EnvEmulatedGPUs, "1:64MiB")
	devs, err := cudaipc.Devices()
	if err != nil {
		t.Fatal(err)
	}
	gs, err := NewGPUSet(r.c, arena, devs, []int64{gpuArena}, GPUConfig{
		SlabBytes: 1 << 20, HighWatermark: 0.75, LowWatermark: 0.5, Workers: 2, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gs.Close)
	return gs
}

// TestGPUPutAfterDeleteDuringPromotion: a device put of a block deleted
// while a promotion from NVMe holds a host reservation for it must be
// stored. GPUSet.Reserve took the doomed promotion's reservation for the
// block and answered ErrExists: the client took the put as a duplicate of
// a block no tier held (the chain's Reserve gives such a reservation up;
// TestPutAfterDeleteDuringPromotion).
func TestGPUPutAfterDeleteDuringPromotion(t *testing.T) {
	const bs = 64 << 10
	k := chainKey(52, 1)
	newBytes := bytes.Repeat([]byte{0xCD}, bs)
	var deleted bool
	var putErr error
	var putHd *Handle
	var once sync.Once
	var r *chainRig
	var gs *GPUSet
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true,
		hook: func(op string, key Key) {
			if op != "get" || key != k {
				return
			}
			once.Do(func() {
				// The promotion holds its host reservation and is about to
				// read: a device session deletes the block and puts it again.
				deleted = gs.Delete(k)
				putHd, putErr = gs.Reserve(k, bs, 0)
			})
		}})
	// The chain rig's host tier manages its own slice; the GPU set needs
	// the same arena registered, which the emulated device only records.
	gs = gpuOverChainRig(t, r, r.h.arena)
	r.putNVMe(t, k, bs)
	r.start()
	if hd, err := acquireWait(t, r.c, k, bs); err == nil {
		r.h.Release(hd)
	}
	if !deleted {
		t.Fatal("Delete found nothing")
	}
	if putErr != nil {
		t.Fatalf("device put after the delete: %v (the block is in no tier: %v)", putErr, !r.inAny(k))
	}
	g := gs.GPUOf(putHd)
	if g == nil {
		t.Fatal("device put with room did not land on the GPU")
	}
	if err := g.run(func(s cudaipc.Stream) error { return g.Dev.CopyHtoDAsync(g.ptr(putHd.Offset), newBytes, s) }); err != nil {
		t.Fatal(err)
	}
	if err := g.Slots.Commit(putHd); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, bs)
	hd, ok := g.Slots.Pin(k)
	if !ok {
		t.Fatal("the block put after the delete is not on the GPU")
	}
	if err := g.run(func(s cudaipc.Stream) error { return g.Dev.CopyDtoHAsync(got, g.ptr(hd.Offset), s) }); err != nil {
		t.Fatal(err)
	}
	g.Slots.Unpin(hd, false)
	if !bytes.Equal(got, newBytes) {
		t.Fatal("the GPU holds other bytes than the put's")
	}
	if r.h.Contains(k) {
		t.Fatal("the deleted generation came back to the host tier")
	}
	eventually(t, 5*time.Second, "the promotion's reservation was not given up", func() bool { return r.h.Stats().Reserved == 0 })
	if _, err := gs.Reserve(k, bs, 0); !errors.Is(err, ErrExists) {
		t.Fatalf("a second put of the stored block: %v, want ErrExists", err)
	}
}

// TestGPUPutAfterDeleteDuringCopy: a put of a block deleted while a
// daemon-side copy of it (a promotion host → GPU, a demotion GPU → host, a
// migration GPU → GPU) holds a reservation for it in the destination tier
// must be stored. That reservation will be aborted (the copy is tombstoned),
// but Reserve found it and answered ErrExists: the writer took its block as
// a duplicate of one no tier holds.
func TestGPUPutAfterDeleteDuringCopy(t *testing.T) {
	for _, tc := range []struct {
		name     string
		at, put  int // where the block is (-1: host), where the new put goes
		startCpy func(r *gpuRig, k Key)
	}{
		{"promotion", -1, 0, func(r *gpuRig, k Key) {
			if hd, ok := r.gs.Acquire(k, gpuBlock, 0, true, func(hd *Handle, err error) {
				if err == nil {
					hd.Owner().Release(hd)
				}
			}); hd != nil || !ok {
				panic("the device read did not start a promotion")
			}
		}},
		{"demotion", 1, -1, func(r *gpuRig, k Key) { r.gs.demoteBatch(r.gs.GPUs[1], 8) }},
		{"migration", 1, 0, func(r *gpuRig, k Key) {
			if hd, ok := r.gs.Acquire(k, gpuBlock, 0, true, func(hd *Handle, err error) {
				if err == nil {
					hd.Owner().Release(hd)
				}
			}); hd != nil || !ok {
				panic("the device read did not start a migration")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newGPURig(t, true)
			k := chainKey(53, 1)
			r.put(t, k, tc.at)
			type res struct {
				deleted bool
				hd      *Handle
				err     error
			}
			got := make(chan res, 1)
			var once sync.Once
			r.gs.copied = func(x Key) {
				if x != k {
					return
				}
				once.Do(func() {
					// The copy is done, its commit to come: a session
					// deletes the block and puts it again.
					var x res
					x.deleted = r.gs.Delete(k)
					x.hd, x.err = r.gs.Reserve(k, gpuBlock, tc.put)
					got <- x
				})
			}
			go tc.startCpy(r, k)
			var x res
			select {
			case x = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("the copy never ran")
			}
			if !x.deleted {
				t.Fatal("Delete found nothing")
			}
			if x.err != nil {
				t.Fatalf("put after the delete: %v", x.err)
			}
			at := x.hd.Owner()
			if g := r.gs.GPUOf(x.hd); g != nil {
				b := blockFor(k, gpuBlock)
				if err := g.run(func(s cudaipc.Stream) error { return g.Dev.CopyHtoDAsync(g.ptr(x.hd.Offset), b, s) }); err != nil {
					t.Fatal(err)
				}
			} else {
				copy(r.h.Bytes(x.hd), blockFor(k, gpuBlock))
			}
			if err := at.Commit(x.hd); err != nil {
				t.Fatalf("commit of the put after the delete: %v", err)
			}
			r.mustHold(t, at, k, "new put's")
			waitFor(t, "the copy's reservation to be given up", func() bool {
				n := r.h.Stats().Reserved
				for _, g := range r.gs.GPUs {
					n += g.Slots.Stats().Reserved
				}
				return n == 0
			})
		})
	}
}

// TestGPUPromotionOfBlockDemotedMeanwhile: a device read of a host block
// hands its promotion host → GPU to a mover; if the host mover writes the
// block down to NVMe and drops it from the host tier before that mover pins
// it, the reader must still get the block (it is cached, in NVMe). The
// promotion answered "left the host tier before its promotion": the
// session answered a miss for a cached block.
func TestGPUPromotionOfBlockDemotedMeanwhile(t *testing.T) {
	store, err := nvme.Open(context.Background(), nvme.Options{Dir: t.TempDir() + "/nvme", CapacityBytes: nvme.MinCapacity, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	r := newGPURigStore(t, 1<<20, 1<<20, store)
	ctx, cancel := context.WithCancel(context.Background())
	started := false
	t.Cleanup(func() { // before the rig's: the movers end before the set closes
		cancel()
		if started {
			r.gs.Wait()
			r.c.Wait()
		}
	})
	g0 := r.gs.GPUs[0]
	k := chainKey(54, 1)
	if at := r.put(t, k, -1); at != r.h {
		t.Fatal("block not put to the host tier")
	}
	type res struct {
		hd  *Handle
		err error
	}
	got := make(chan res, 1)
	// The movers are not running yet: the promotion waits in the queue.
	if hd, ok := r.gs.Acquire(k, gpuBlock, 0, true, func(hd *Handle, err error) { got <- res{hd, err} }); hd != nil || !ok {
		t.Fatalf("device read of a host block with room: lease %v, ok %v; want a promotion", hd != nil, ok)
	}
	// The host mover takes the block down to NVMe meanwhile (as
	// Chain.demoteBatch does with a victim it pinned).
	if hd, ok := r.h.PinUnleased(k); ok {
		if ok, _, _, _ := r.c.writeDown([]*Handle{hd}); !ok[0] {
			t.Fatal("write-down to NVMe failed")
		}
		r.h.Unpin(hd, true)
	}
	r.c.Start(ctx)
	r.gs.Start(ctx)
	started = true
	var x res
	select {
	case x = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the device read was never answered")
	}
	if x.err != nil {
		t.Fatalf("device read of a cached block: %v (host %v, nvme %v, gpu %v)", x.err, r.h.Contains(k), store.Contains(nk(k)), g0.Slots.Contains(k))
	}
	defer x.hd.Owner().Release(x.hd)
	r.mustHold(t, x.hd.Owner(), k, "leased")
}

// TestGPULookupOfBlockAlsoInNVMe: a block on a GPU that NVMe holds too (put
// to the GPU, demoted GPU → host → NVMe, promoted back NVMe → host → GPU,
// its host copy dropped again) is looked up as a GPU hit, and the lookup
// queues no prefetch: docs/metrics.md counts in kvtier_prefetches_total the
// blocks a lookup found only in NVMe. The chain's lookup asked NVMe before
// the GPUs: the block was reported in NVMe and read back into the host tier
// for nothing, at every lookup.
func TestGPULookupOfBlockAlsoInNVMe(t *testing.T) {
	store, err := nvme.Open(context.Background(), nvme.Options{Dir: t.TempDir() + "/nvme", CapacityBytes: nvme.MinCapacity, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	r := newGPURigStore(t, 1<<20, 1<<20, store)
	ks := []Key{chainKey(55, 0), chainKey(55, 1), chainKey(55, 2)}
	r.put(t, ks[0], -1) // host
	for _, k := range ks[1:] {
		if at := r.put(t, k, 0); at != r.gs.GPUs[0].Slots {
			t.Fatal("block not put to GPU 0")
		}
	}
	if err := store.Put(nk(ks[1]), blockFor(ks[1], gpuBlock)); err != nil {
		t.Fatal(err)
	}
	out := make([]shm.Tier, len(ks))
	hits, _ := r.gs.Lookup(ks, out)
	if hits != len(ks) {
		t.Fatalf("lookup: %d hits of %d", hits, len(ks))
	}
	want := []shm.Tier{shm.TierHost, shm.TierGPU, shm.TierGPU}
	for i := range ks {
		if out[i] != want[i] {
			t.Errorf("block %d reported in tier %v, want %v", i, out[i], want[i])
		}
	}
	if n := r.c.Stats().Prefetches; n != 0 {
		t.Errorf("the lookup queued %d prefetches of blocks on the GPU, want 0", n)
	}
}
