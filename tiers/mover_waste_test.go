package tiers

import (
	"testing"
	"time"
)

// TestMoverCountsSlabWaste: the mover's watermarks are of the host tier's
// room for new blocks. With blocks that do not divide the slab (80 KiB in
// 1 MiB slabs: 12 to a slab, 64 KiB of each slab never used), a full tier
// holds 93.75% of its bytes in blocks; the mover must still demote before
// the next put has to evict a block that has no copy below.
func TestMoverCountsSlabWaste(t *testing.T) {
	const bs, slab, slabs = 80 << 10, 1 << 20, 8
	const full = slabs * (slab / bs) // 96 blocks fill every slot
	r := newChainRig(t, rigOpts{hostBytes: slabs * slab, slabBytes: slab,
		cfg: ChainConfig{HighWatermark: 0.95, LowWatermark: 0.85, Policy: "lru"}})
	keys := make([]Key, full+1)
	for i := range keys {
		keys[i] = chainKey(1, uint64(i))
	}
	for _, k := range keys[:full] {
		r.putHost(t, k, bs)
	}
	deadline := time.Now().Add(3 * time.Second)
	for r.c.Stats().Demoted == 0 {
		if time.Now().After(deadline) {
			used, capacity := r.h.Usage()
			t.Fatalf("host tier full (%d blocks, no free slot, %d of %d bytes in blocks) and the mover demoted nothing",
				r.h.Stats().Blocks, used, capacity)
		}
		time.Sleep(2 * time.Millisecond)
	}
	// A demoted block freed its slot: the next put takes it.
	r.putHost(t, keys[full], bs)
	if ev := r.h.Stats().Evictions; ev != 0 {
		t.Fatalf("host tier evicted %d blocks without a copy below", ev)
	}
	for i, k := range keys {
		if !r.inAny(k) {
			t.Fatalf("block %d lost: in no tier", i)
		}
	}
}

// TestMoverDemotesAtHighWatermarkOne: host.high_watermark = 1 is valid
// (0 < high <= 1); the tier can never be above it, but a full tier must
// still be demoted (to the low watermark) rather than leave every later put
// to evict a block that has no copy below.
func TestMoverDemotesAtHighWatermarkOne(t *testing.T) {
	const bs, full = 64 << 10, 128 // 128 blocks fill 8 MiB
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20,
		cfg: ChainConfig{HighWatermark: 1, LowWatermark: 0.5, Policy: "lru"}})
	keys := make([]Key, full+1)
	for i := range keys {
		keys[i] = chainKey(2, uint64(i))
	}
	for _, k := range keys[:full] {
		r.putHost(t, k, bs)
	}
	deadline := time.Now().Add(3 * time.Second)
	for r.c.Stats().Demoted == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("host tier full (%d blocks) at high watermark 1 and the mover demoted nothing", r.h.Stats().Blocks)
		}
		time.Sleep(2 * time.Millisecond)
	}
	r.putHost(t, keys[full], bs)
	if ev := r.h.Stats().Evictions; ev != 0 {
		t.Fatalf("host tier evicted %d blocks without a copy below", ev)
	}
	for i, k := range keys {
		if !r.inAny(k) {
			t.Fatalf("block %d lost: in no tier", i)
		}
	}
}
