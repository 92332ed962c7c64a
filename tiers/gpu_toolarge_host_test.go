//go:build !cuda

package tiers

import (
	"testing"
	"time"
)

// TestGPUDemoterSkipsBlocksTooLargeForHost: gpu.slab_bytes may exceed
// host.slab_bytes, so a GPU can hold blocks the host tier cannot take. The
// coldest GPU blocks being such blocks, the demoter must still demote the
// others down to the low watermark, not retry the same undemotable blocks
// at every pass while the arena stays full and every device put falls back
// to the host tier.
func TestGPUDemoterSkipsBlocksTooLargeForHost(t *testing.T) {
	const big, small = 512 << 10, 128 << 10 // host slab 256 KiB, GPU slab 1 MiB
	r := newGPURigOpts(t, gpuRigOpts{hostSlab: 256 << 10, start: true})
	gs, h := r.gs, r.h
	g := gs.GPUs[0]
	put := func(k Key, size int64) *Host { t.Helper(); return r.putSized(t, k, size, 0) }
	for i := range 8 { // 4 of the 8 GPU slabs, the oldest blocks
		if at := put(chainKey(1, uint64(i)), big); at != g.Slots {
			t.Fatalf("big block %d not put on the GPU", i)
		}
	}
	fell := false
	for i := 0; i < 64 && !fell; i++ {
		fell = put(chainKey(2, uint64(i)), small) == h
	}
	if !fell {
		t.Fatal("no device put fell back to the host tier")
	}
	_, capacity := g.Slots.Occupied()
	deadline := time.Now().Add(3 * time.Second)
	for {
		used, _ := g.Slots.Occupied()
		if float64(used) <= gs.cfg.LowWatermark*float64(capacity) {
			return
		}
		if time.Now().After(deadline) {
			st := gs.Stats()
			t.Fatalf("GPU arena stuck at %d of %d bytes (low watermark %.2f) after %d demoter passes: %d blocks demoted; the demoter retried the blocks too large for the host tier",
				used, capacity, gs.cfg.LowWatermark, g.passes.Load(), st.Demotions[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
