//go:build !cuda

package tiers

import (
	"testing"
	"time"
)

// TestGPUPromotionFallbackCountsEveryRead: kvtier_gpu_promotion_fallbacks_total
// counts device reads served from the host tier because the arena had no room
// to promote. Reads of one block that join one promotion which then finds no
// room are each such a read; the promotion used to count one for all.
func TestGPUPromotionFallbackCountsEveryRead(t *testing.T) {
	const readers = 3
	r := newGPURigN(t, 1, false) // no workers: the promotion waits in the queue
	g0 := r.gs.GPUs[0]
	k := chainKey(67, 1)
	if at := r.put(t, k, -1); at != r.h {
		t.Fatal("block not put to the host tier")
	}
	type res struct {
		hd  *Handle
		err error
	}
	got := make(chan res, readers)
	for range readers {
		if hd, ok := r.gs.Acquire(k, gpuBlock, 0, true, func(hd *Handle, err error) { got <- res{hd, err} }); hd != nil || !ok {
			t.Fatalf("device read of a host block with room on the GPU: lease %v, ok %v; want a promotion", hd != nil, ok)
		}
	}
	// The arena fills before the promotion runs.
	var fill []*Handle
	for i := uint64(0); ; i++ {
		hd, err := g0.Slots.Reserve(chainKey(68, i), gpuBlock)
		if err != nil {
			break
		}
		fill = append(fill, hd)
	}
	defer func() {
		for _, hd := range fill {
			g0.Slots.Abort(hd)
		}
	}()
	before := r.gs.Stats().PromotionFallbacks[0]
	select {
	case f := <-r.gs.jobs:
		f()
	default:
		t.Fatal("no promotion queued")
	}
	for i := range readers {
		select {
		case x := <-got:
			if x.err != nil {
				t.Fatalf("read %d: %v", i, x.err)
			}
			if x.hd.Owner() != r.h {
				t.Fatalf("read %d not served from the host tier", i)
			}
			x.hd.Owner().Release(x.hd)
		case <-time.After(10 * time.Second):
			t.Fatalf("read %d never answered", i)
		}
	}
	if d := r.gs.Stats().PromotionFallbacks[0] - before; d != readers {
		t.Fatalf("promotion fallbacks rose by %d for %d reads served from the host tier for want of room, want %d", d, readers, readers)
	}
}
