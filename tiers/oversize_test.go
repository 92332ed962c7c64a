package tiers

import (
	"testing"
	"time"
)

// TestDemotionOfBlocksNVMeCannotHold: blocks larger than the NVMe tier's
// largest block (a small nvme.capacity: small segments) have no tier below
// the host. The mover drops them when they are the coldest, counted, and
// demotes the blocks that fit, also those it meets in the same batch;
// before, one such block failed its writer's whole batch at every pass,
// and the host tier stayed above its watermark.
func TestDemotionOfBlocksNVMeCannotHold(t *testing.T) {
	const slab = 32 << 20
	r := newChainRig(t, rigOpts{hostBytes: 8 * slab, slabBytes: slab, nvmeBytes: 512 << 20, noStart: true,
		cfg: ChainConfig{HighWatermark: 0.5, LowWatermark: 0.25, Policy: "lru"}})
	big := r.store.MaxBlockBytes() + 4096
	var bigKeys, small []Key
	for i := range 4 { // 4 × 15 MiB + 4 KiB, interleaved with small ones
		k := chainKey(60, uint64(i))
		bigKeys = append(bigKeys, k)
		r.putHost(t, k, big)
		for j := range 5 {
			s := chainKey(61, uint64(i*5+j))
			small = append(small, s)
			r.putHost(t, s, 4<<20)
		}
	}
	r.start()
	eventually(t, 10*time.Second, "host tier above its high watermark", func() bool {
		used, capacity := r.h.Usage()
		return used <= capacity/2
	})
	time.Sleep(300 * time.Millisecond) // let the pass reach the low watermark
	st := r.c.Stats()
	if st.OversizeDrops == 0 {
		t.Fatalf("no block too large for NVMe was dropped: %+v", st)
	}
	for _, k := range bigKeys {
		if r.store.Contains(nk(k)) {
			t.Fatalf("NVMe holds a block above its limit")
		}
	}
	inNVMe := 0
	for _, k := range small {
		if r.store.Contains(nk(k)) {
			inNVMe++
			continue
		}
		if !r.h.Contains(k) {
			t.Fatalf("small block %v lost: it fits in NVMe", k)
		}
	}
	if inNVMe == 0 {
		t.Fatal("no small block was demoted")
	}
	if st.DemoteErrors != 0 {
		t.Fatalf("%d demotion errors: the oversize blocks failed their batches", st.DemoteErrors)
	}
	t.Logf("oversize drops %d, small blocks in NVMe %d of %d, demoted %d", st.OversizeDrops, inNVMe, len(small), st.Demoted)
}
