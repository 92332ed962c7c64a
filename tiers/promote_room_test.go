package tiers

import (
	"testing"
)

// TestPromotionMakesRoomInAFragmentedTier: a promotion makes room by
// demotion first (copyUp, makeRoom), so that the host tier's own eviction
// does not drop a block that has no copy below. Under the watermark is not
// room enough: with several block sizes, the tier's free bytes may all be
// free slots of other classes' slabs, no slab free and none compactable,
// and the promotion's reservation then evicts. Here the tier is under half
// full, the disk nearly empty, and a block of each of four sizes sits alone
// in its slab: promoting a fifth size must not lose any of them.
func TestPromotionMakesRoomInAFragmentedTier(t *testing.T) {
	const slab = 256 << 10
	r := newChainRig(t, rigOpts{hostBytes: 4 * slab, slabBytes: slab,
		cfg: ChainConfig{HighWatermark: 0.9, LowWatermark: 0.8, Policy: "lru"}})
	sizes := []int64{64 << 10, 128 << 10, 96 << 10, 80 << 10} // a slab each
	keys := make([]Key, len(sizes))
	for i, size := range sizes {
		keys[i] = chainKey(1, uint64(i))
		r.putHost(t, keys[i], size)
	}
	if hs := r.h.Stats(); hs.SlabsFree != 0 {
		t.Fatalf("%d slabs free, want every slab taken", hs.SlabsFree)
	}
	used, capacity := r.h.Occupied()
	if high, _ := r.c.Watermarks(); float64(used) > high*float64(capacity)/2 {
		t.Fatalf("host tier occupied %d of %d: want under half its high watermark", used, capacity)
	}
	x := chainKey(2, 1)
	const xs = 32 << 10
	r.putNVMe(t, x, xs)
	hd, err := acquireWait(t, r.c, x, xs)
	if err != nil {
		t.Fatalf("promotion: %v", err)
	}
	r.checkHostBytes(t, x, xs)
	r.h.Release(hd)
	for i, k := range keys {
		if !r.inAny(k) {
			t.Errorf("block %d (%d bytes) lost from every tier: the host tier evicted it (%d evictions) at %d of %d bytes occupied, the disk nearly empty",
				i, sizes[i], r.h.Stats().Evictions, used, capacity)
		}
	}
}
