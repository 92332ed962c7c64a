package tiers

import (
	"errors"
	"math/rand/v2"
	"testing"
)

type adoptOp struct {
	k      Key
	off    int64
	size   int64
	err    error // wanted; nil = success
	before func(t *testing.T, h *Host, arena []byte)
}

func TestAdopt(t *testing.T) {
	const slab = 16 << 10 // 4 slabs of 16 KiB, align 4096
	tests := []struct {
		name string
		ops  []adoptOp
	}{
		{"free slab, first slot", []adoptOp{{k: key(1, 1), off: 0, size: 4096}}},
		{"free slab, skipping slots", []adoptOp{{k: key(1, 1), off: slab + 3*4096, size: 4096}}},
		{"odd size rounds up to its stride", []adoptOp{{k: key(1, 1), off: 2 * slab, size: 5000}, {k: key(1, 2), off: 2*slab + 8192, size: 5000}}},
		{"whole slab", []adoptOp{{k: key(1, 1), off: 3 * slab, size: slab}}},
		{"fill a skipped slot later", []adoptOp{
			{k: key(1, 1), off: 3 * 4096, size: 4096},
			{k: key(1, 2), off: 1 * 4096, size: 4096},
			{k: key(1, 3), off: 0, size: 4096},
			{k: key(1, 4), off: 2 * 4096, size: 4096}, // slab now full
		}},
		{"same key twice", []adoptOp{
			{k: key(1, 1), off: 0, size: 4096},
			{k: key(1, 1), off: 4096, size: 4096, err: ErrExists},
		}},
		{"occupied slot", []adoptOp{
			{k: key(1, 1), off: 4096, size: 4096},
			{k: key(1, 2), off: 4096, size: 4096, err: ErrAdopt},
		}},
		{"slab of another class", []adoptOp{
			{k: key(1, 1), off: 0, size: 4096},
			{k: key(1, 2), off: 8192, size: 8192, err: ErrAdopt},
		}},
		{"slot of a reserved block", []adoptOp{
			{k: key(2, 1), off: 0, size: 4096, before: func(t *testing.T, h *Host, _ []byte) {
				if _, err := h.Reserve(key(2, 9), 4096); err != nil { // takes slab 0 slot 0
					t.Fatal(err)
				}
			}, err: ErrAdopt},
		}},
		{"key being reserved", []adoptOp{
			{k: key(2, 9), off: slab, size: 4096, before: func(t *testing.T, h *Host, _ []byte) {
				if _, err := h.Reserve(key(2, 9), 4096); err != nil {
					t.Fatal(err)
				}
			}, err: ErrExists},
		}},
		{"misaligned offset", []adoptOp{{k: key(1, 1), off: 100, size: 4096, err: ErrAdopt}}},
		{"offset between strides", []adoptOp{{k: key(1, 1), off: 4096, size: 5000, err: ErrAdopt}}},
		{"crosses the slab end", []adoptOp{{k: key(1, 1), off: 12288, size: 8192, err: ErrAdopt}}},
		{"in the slab's tail waste", []adoptOp{{k: key(1, 1), off: 12288, size: 6000, err: ErrAdopt}}},
		{"past the arena", []adoptOp{{k: key(1, 1), off: 4 * slab, size: 4096, err: ErrAdopt}}},
		{"ends past the arena", []adoptOp{{k: key(1, 1), off: 4*slab - 4096, size: 8192, err: ErrAdopt}}},
		{"negative offset", []adoptOp{{k: key(1, 1), off: -4096, size: 4096, err: ErrAdopt}}},
		{"zero size", []adoptOp{{k: key(1, 1), off: 0, size: 0, err: ErrBadSize}}},
		{"larger than a slab", []adoptOp{{k: key(1, 1), off: 0, size: slab + 1, err: ErrTooLarge}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, arena := newHost(t, slab, 4)
			for i, op := range tt.ops {
				if op.before != nil {
					op.before(t, h, arena)
				}
				before := h.Stats()
				err := h.Adopt(op.k, op.off, op.size)
				if op.err == nil && err != nil || op.err != nil && !errors.Is(err, op.err) {
					t.Fatalf("op %d: Adopt(%v, %d, %d) = %v, want %v", i, op.k, op.off, op.size, err, op.err)
				}
				mustCheck(t, h)
				after := h.Stats()
				if err != nil {
					if after.Blocks != before.Blocks || after.UsedBytes != before.UsedBytes || after.SlabsFree != before.SlabsFree {
						t.Fatalf("op %d: failed Adopt changed the tier: %+v -> %+v", i, before, after)
					}
					continue
				}
				if after.Blocks != before.Blocks+1 || after.UsedBytes != before.UsedBytes+op.size {
					t.Fatalf("op %d: stats %+v -> %+v", i, before, after)
				}
				hd, ok := h.Pin(op.k)
				if !ok || hd.Offset != op.off || hd.Size != op.size {
					t.Fatalf("op %d: adopted block not found at its offset: %+v", i, hd)
				}
				h.Unpin(hd, false)
			}
			mustCheck(t, h)
		})
	}
}

// TestAdoptRebuildsTier fills a tier, adopts its blocks into a fresh Host
// over the same arena (what a warm restart does), and checks that the
// rebuilt tier holds the same blocks at the same offsets in the same
// recency order, and then works normally: hits, reservations, eviction in
// LRU order, compaction moving adopted blocks.
func TestAdoptRebuildsTier(t *testing.T) {
	const slab = 64 << 10
	sizes := []int64{4096, 8192, 12000, 20000}
	rng := rand.New(rand.NewPCG(1, 2))
	h1, arena := newHost(t, slab, 8)
	for i := uint64(0); i < 400; i++ {
		ns := uint32(1 + i%uint64(len(sizes)))
		k := key(ns, i)
		hd, err := h1.Reserve(k, sizes[ns-1])
		if err != nil {
			t.Fatal(err)
		}
		writePattern(arena, hd, 7)
		if err := h1.Commit(hd); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(4) == 0 { // some deletions leave holes in slabs
			h1.Delete(key(ns, uint64(rng.IntN(int(i+1)))))
		}
		if rng.IntN(3) == 0 { // and reads shuffle recency
			if hd, ok := h1.Acquire(key(ns, uint64(rng.IntN(int(i+1))))); ok {
				h1.Release(hd)
			}
		}
	}
	mustCheck(t, h1)
	hs := h1.PinAllOldestFirst()
	type rec struct {
		k         Key
		off, size int64
	}
	var snap []rec
	for _, hd := range hs {
		snap = append(snap, rec{hd.Key, hd.Offset, hd.Size})
	}
	for _, hd := range hs {
		h1.Unpin(hd, false)
	}
	if len(snap) == 0 {
		t.Fatal("nothing to adopt")
	}
	st1 := h1.Stats()

	h2, err := NewHost(arena, HostConfig{SlabBytes: slab})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range snap {
		if err := h2.Adopt(r.k, r.off, r.size); err != nil {
			t.Fatalf("adopt %v at %d: %v", r.k, r.off, err)
		}
	}
	mustCheck(t, h2)
	st2 := h2.Stats()
	if st2.Blocks != st1.Blocks || st2.UsedBytes != st1.UsedBytes || st2.SlabsFree != st1.SlabsFree {
		t.Fatalf("rebuilt tier differs: %+v vs %+v", st2, st1)
	}
	// Recency: oldest first, as snapshotted.
	again := h2.PinAllOldestFirst()
	for i, hd := range again {
		if hd.Key != snap[i].k || hd.Offset != snap[i].off {
			t.Fatalf("recency order differs at %d: %v@%d, want %v@%d", i, hd.Key, hd.Offset, snap[i].k, snap[i].off)
		}
		if err := checkPattern(arena, hd, 7); err != nil {
			t.Fatal(err)
		}
		h2.Unpin(hd, false) // keeps the order: each becomes MRU in turn
	}
	mustCheck(t, h2)

	// Normal operation: a full tier evicts the LRU adopted block first,
	// compaction moves adopted blocks intact, and a whole-slab block forces
	// slabs to be drained.
	oldest := snap[0].k
	for i := uint64(0); ; i++ {
		st := h2.Stats()
		if st.Evictions > 0 {
			break
		}
		if i > 1000 {
			t.Fatal("never evicted")
		}
		hd, err := h2.Reserve(key(9, i), 4096)
		if err != nil {
			t.Fatal(err)
		}
		writePattern(arena, hd, 7)
		h2.Commit(hd)
		mustCheck(t, h2)
	}
	if h2.Contains(oldest) && snap[0].size == 4096 {
		t.Errorf("LRU adopted block %v survived the first 4 KiB eviction", oldest)
	}
	for i := 0; i < 4; i++ {
		hd, err := h2.Reserve(key(10, uint64(i)), slab)
		if err != nil {
			t.Fatal(err)
		}
		writePattern(arena, hd, 7)
		h2.Commit(hd)
		mustCheck(t, h2)
	}
	st := h2.Stats()
	if st.Compactions == 0 && st.Evictions == 0 {
		t.Errorf("whole-slab reservations neither compacted nor evicted: %+v", st)
	}
	survivors := 0
	for _, r := range snap {
		hd, ok := h2.Acquire(r.k)
		if !ok {
			continue
		}
		survivors++
		if err := checkPattern(arena, hd, 7); err != nil {
			t.Fatalf("adopted block after compaction: %v", err)
		}
		h2.Release(hd)
	}
	t.Logf("adopted %d blocks; %d survive after %d evictions, %d compactions (%d blocks moved)",
		len(snap), survivors, st.Evictions, st.Compactions, st.CompactedBlocks)
	if h2.DeleteNS(1) == 0 && h2.DeleteNS(2) == 0 && h2.DeleteNS(3) == 0 && h2.DeleteNS(4) == 0 && survivors > 0 {
		t.Error("DeleteNS found no adopted block")
	}
	mustCheck(t, h2)
}
