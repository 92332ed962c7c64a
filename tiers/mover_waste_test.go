package tiers

import (
	"testing"
	"time"
)

// TestMoverDemotesAFullTier: a host tier with no free slot must be
// demoted before the next put has to evict a block that has no copy below,
// whatever its watermarks count:
//   - slab waste: the watermarks are of the tier's room for new blocks.
//     With blocks that do not divide the slab (80 KiB in 1 MiB slabs: 12 to
//     a slab, 64 KiB of each never used), a full tier holds 93.75% of its
//     bytes in blocks, under a high watermark of 0.95;
//   - high watermark 1 is valid (0 < high <= 1): the tier can never be
//     above it, but a full tier still goes down to the low watermark.
func TestMoverDemotesAFullTier(t *testing.T) {
	for _, tc := range []struct {
		name      string
		bs, slabs int
		high, low float64
	}{
		{"slab waste", 80 << 10, 8, 0.95, 0.85},
		{"high watermark 1", 64 << 10, 8, 1, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const slab = 1 << 20
			full := tc.slabs * (slab / tc.bs) // blocks that fill every slot
			r := newChainRig(t, rigOpts{hostBytes: int64(tc.slabs) * slab, slabBytes: slab,
				cfg: ChainConfig{HighWatermark: tc.high, LowWatermark: tc.low, Policy: "lru"}})
			keys := make([]Key, full+1)
			for i := range keys {
				keys[i] = chainKey(1, uint64(i))
			}
			for _, k := range keys[:full] {
				r.putHost(t, k, int64(tc.bs))
			}
			deadline := time.Now().Add(3 * time.Second)
			for r.c.Stats().Demoted == 0 {
				if time.Now().After(deadline) {
					used, capacity := r.h.Usage()
					t.Fatalf("host tier full (%d blocks, no free slot, %d of %d bytes in blocks, high watermark %v) and the mover demoted nothing",
						r.h.Stats().Blocks, used, capacity, tc.high)
				}
				time.Sleep(2 * time.Millisecond)
			}
			// A demoted block freed its slot: the next put takes it.
			r.putHost(t, keys[full], int64(tc.bs))
			if ev := r.h.Stats().Evictions; ev != 0 {
				t.Fatalf("host tier evicted %d blocks without a copy below", ev)
			}
			for i, k := range keys {
				if !r.inAny(k) {
					t.Fatalf("block %d lost: in no tier", i)
				}
			}
		})
	}
}
