//go:build !cuda

package tiers

import (
	"testing"
	"time"
)

// TestGPUDemoterCountsSlabWaste: blocks of 600 KiB take a 1 MiB GPU slab
// each, so a full arena holds 58.6% of its bytes in blocks, under the low
// watermark (0.8). A device put that finds no slot falls back to the host
// tier and asks the demoter for room; the demoter must free slots, else
// the oldest blocks hold the GPU forever and every later device put goes to
// the host tier.
func TestGPUDemoterCountsSlabWaste(t *testing.T) {
	const bs = 600 << 10
	r := newGPURigOpts(t, gpuRigOpts{high: 0.9, low: 0.8, start: true})
	gs, h := r.gs, r.h
	g := gs.GPUs[0]
	put := func(k Key) *Host { t.Helper(); return r.putSized(t, k, bs, 0) }
	fell := -1 // one block per slab: the 9th cannot fit
	for i := range 9 {
		if at := put(chainKey(61, uint64(i))); at == h {
			fell = i
			break
		}
	}
	if fell < 0 {
		t.Fatal("9 blocks of a slab each went to an arena of 8 slabs")
	}
	deadline := time.Now().Add(3 * time.Second)
	for g.demoted.Load() == 0 || !g.hasRoom(bs) {
		if time.Now().After(deadline) {
			used, capacity := g.Slots.Usage()
			t.Fatalf("GPU arena full (%d blocks, %d of %d bytes in blocks) after a put fell back, and the demoter made no room",
				g.Slots.Stats().Blocks, used, capacity)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if at := put(chainKey(61, 100)); at != g.Slots {
		used, capacity := g.Slots.Occupied()
		t.Fatalf("the next device put fell back to the host tier too (GPU %d of %d bytes taken, %d blocks)", used, capacity, g.Slots.Stats().Blocks)
	}
}
