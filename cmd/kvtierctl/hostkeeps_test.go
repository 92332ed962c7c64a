package main

import (
	"errors"
	"testing"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
)

// plan's and replay's "host tier holds N blocks" capped the blocks at
// high × capacity / block bytes, but the host mover counts slab space
// (tiers.Host.Occupied: a slab's tail past its last whole stride, and a
// stride's padding past the block, are occupied) and demotes a full tier
// whatever its high watermark. With 6 MiB blocks in 160 MiB of 16 MiB
// slabs at 0.95 the tier keeps 18 blocks (18 occupy 148 MiB, 19 occupy 154
// MiB > 152), not 20. The figures are checked against the real allocator:
// N blocks packed leave the tier at rest, one more puts it above its high
// watermark (or does not fit).
func TestHostHoldsBlocksAsTheMoverCounts(t *testing.T) {
	for _, c := range []struct {
		name            string
		capa, slab, blk int64
		high            float64
		want            int64
	}{
		{"6 MiB blocks: 4 MiB of each slab", 160 << 20, 16 << 20, 6 << 20, 0.95, 18},
		{"5 MiB blocks: 1 MiB of each slab", 160 << 20, 16 << 20, 5 << 20, 0.95, 28},
		{"10000 B blocks in 12 KiB strides", 16 << 20, 1 << 20, 10000, 0.95, 1291},
		{"16 KiB blocks fill their slabs", 32 << 20, 16 << 20, 16 << 10, 0.95, 1945},
		{"a full tier demotes at 1", 32 << 20, 16 << 20, 2 << 20, 1, 15},
		{"no nvme: whole blocks per slab", 160 << 20, 16 << 20, 6 << 20, 0, 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := hostHoldsBlocks(&shm.TierStats{CapacityBytes: c.capa, SlabBytes: c.slab, HighWatermark: c.high}, uint64(c.blk))
			if n != c.want {
				t.Errorf("host tier holds %d blocks, want %d", n, c.want)
			}
			h, err := tiers.NewHost(make([]byte, c.capa), tiers.HostConfig{SlabBytes: c.slab, NoEvict: true})
			if err != nil {
				t.Fatal(err)
			}
			put := func(i int64) error {
				hd, err := h.Reserve(tiers.Key{NS: 1, Hash: shm.Hash{Lo: uint64(i)}}, c.blk)
				if err != nil {
					return err
				}
				return h.Commit(hd)
			}
			// tiers/chain.go: above.
			above := func() bool {
				used, capa := h.Occupied()
				return float64(used) > c.high*float64(capa) || used >= capa
			}
			for i := range c.want {
				if err := put(i); err != nil {
					t.Fatalf("block %d of %d: %v", i, c.want, err)
				}
			}
			if c.high > 0 && above() {
				used, capa := h.Occupied()
				t.Errorf("%d blocks occupy %d of %d bytes: above the high watermark %v", c.want, used, capa, c.high)
			}
			err = put(c.want)
			switch {
			case errors.Is(err, tiers.ErrFull):
			case err != nil:
				t.Fatal(err)
			case c.high == 0 || !above():
				t.Errorf("the tier takes block %d and stays at rest", c.want+1)
			}
		})
	}

	// plan: llama-3-8b bf16 at 48 tokens is 6 MiB a block.
	r, err := computePlan(planInput{Model: preset(t, "llama-3-8b"), DType: "bf16", TP: 1, TokensPerBlock: 48,
		Concurrency: 1, AvgContext: 48, HostBytes: 160 << 20, SlabBytes: 16 << 20, NVMeBytes: 64 * gib})
	if err != nil {
		t.Fatal(err)
	}
	if r.BlockBytes != 6<<20 || len(r.Tiers) == 0 || r.Tiers[0].Name != "host" {
		t.Fatalf("plan: %+v", r)
	}
	if got := r.Tiers[0].BlocksFit; got != 18 {
		t.Errorf("plan: the host tier holds %d blocks of 6 MiB, want 18", got)
	}
}

// A GPU arena is the same slab allocator (tiers.NewSlots, in slabs of the
// host tier's size by default) and its demoter counts slab space too; plan
// counted block bytes: 1 GiB of 64 MiB slabs at 0.9 keeps 143 blocks of 6
// MiB (144 occupy 924 MiB > 921.6), not 153 (nor, without the watermark,
// 170: a slab holds 10).
func TestPlanGPUHoldsBlocksAsTheDemoterCounts(t *testing.T) {
	for _, c := range []struct {
		tp   int
		high float64
		want uint64
	}{{1, 0.9, 143}, {1, 1, 160}} {
		r, err := computePlan(planInput{Model: preset(t, "llama-3-8b"), DType: "bf16", TP: c.tp, TokensPerBlock: 48,
			Concurrency: 1, AvgContext: 48, GPUBytes: gib, GPUHigh: c.high})
		if err != nil {
			t.Fatal(err)
		}
		if r.BlockBytes != 6<<20 || len(r.Tiers) != 1 || r.Tiers[0].Name != "gpu" {
			t.Fatalf("plan: %+v", r)
		}
		if got := r.Tiers[0].BlocksFit; got != c.want {
			t.Errorf("plan: %d GPUs of 1 GiB at %v hold %d blocks of 6 MiB, want %d", c.tp, c.high, got, c.want)
		}
		// The allocator agrees: 1 GiB in 64 MiB slabs, packed.
		h, err := tiers.NewSlots(1<<30, tiers.HostConfig{SlabBytes: 64 << 20, NoEvict: true,
			Move: func(dst, src, n int64) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		per := c.want / uint64(c.tp)
		for i := range per + 1 {
			hd, err := h.Reserve(tiers.Key{NS: 1, Hash: shm.Hash{Lo: i}}, 6<<20)
			if errors.Is(err, tiers.ErrFull) && i == per {
				break // full at 1
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Commit(hd); err != nil {
				t.Fatal(err)
			}
			used, capa := h.Occupied()
			if over := float64(used) > c.high*float64(capa); over != (i == per) {
				t.Errorf("%d blocks occupy %d of %d bytes: above %v = %v", i+1, used, capa, c.high, over)
			}
		}
	}
}
