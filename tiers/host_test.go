package tiers

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/shm"
)

func key(ns uint32, n uint64) Key { return Key{NS: ns, Hash: shm.Hash{Hi: 0xabc, Lo: n}} }

func newHost(t testing.TB, slabBytes int64, slabs int) (*Host, []byte) {
	t.Helper()
	arena := make([]byte, slabBytes*int64(slabs))
	h, err := NewHost(arena, HostConfig{SlabBytes: slabBytes})
	if err != nil {
		t.Fatal(err)
	}
	return h, arena
}

// put reserves, fills and commits a block.
func put(t testing.TB, h *Host, arena []byte, k Key, size int64) *Handle {
	t.Helper()
	hd, err := h.Reserve(k, size)
	if err != nil {
		t.Fatalf("reserve %v: %v", k, err)
	}
	writePattern(arena, hd, 1)
	if err := h.Commit(hd); err != nil {
		t.Fatal(err)
	}
	return hd
}

func mustCheck(t *testing.T, h *Host) {
	t.Helper()
	if err := checkHost(h); err != nil {
		t.Fatal(err)
	}
}

func TestNewHostConfig(t *testing.T) {
	tests := []struct {
		name  string
		arena int
		cfg   HostConfig
		ok    bool
	}{
		{"ok default align", 1 << 20, HostConfig{SlabBytes: 64 << 10}, true},
		{"ok small align", 3 * 1000, HostConfig{SlabBytes: 1000, Align: 8}, true},
		{"zero slab", 1 << 20, HostConfig{}, false},
		{"slab not aligned", 1 << 20, HostConfig{SlabBytes: 5000}, false},
		{"arena not multiple", 100 << 10, HostConfig{SlabBytes: 64 << 10}, false},
		{"empty arena", 0, HostConfig{SlabBytes: 4096}, false},
		{"negative align", 8192, HostConfig{SlabBytes: 4096, Align: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewHost(make([]byte, tt.arena), tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestReserveErrors(t *testing.T) {
	h, arena := newHost(t, 16<<10, 2)
	put(t, h, arena, key(1, 1), 4096)
	if _, err := h.Reserve(key(1, 2), 4096); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		k    Key
		size int64
		want error
	}{
		{"committed dup", key(1, 1), 4096, ErrExists},
		{"reserved dup", key(1, 2), 4096, ErrExists},
		{"dup other size", key(1, 1), 8192, ErrExists},
		{"zero size", key(1, 3), 0, ErrBadSize},
		{"negative size", key(1, 3), -5, ErrBadSize},
		{"too large", key(1, 3), 16<<10 + 1, ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.Stats()
			if _, err := h.Reserve(tt.k, tt.size); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if after := h.Stats(); after.UsedBytes != before.UsedBytes || after.SlabsFree != before.SlabsFree {
				t.Fatalf("failed reserve allocated: %+v", after)
			}
		})
	}
	if hd, err := h.Reserve(key(1, 3), 16<<10); err != nil || hd.Offset%4096 != 0 {
		t.Fatalf("slab-sized block: %v", err)
	}
	mustCheck(t, h)
}

func TestHandleStateErrors(t *testing.T) {
	h, arena := newHost(t, 16<<10, 1)
	other, _ := newHost(t, 16<<10, 1)
	foreign, err := other.Reserve(key(1, 1), 4096)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		run  func() error
	}{
		{"commit twice", func() error {
			hd := put(t, h, arena, key(1, 10), 4096)
			return h.Commit(hd)
		}},
		{"commit after abort", func() error {
			hd, _ := h.Reserve(key(1, 11), 4096)
			if err := h.Abort(hd); err != nil {
				t.Fatal(err)
			}
			return h.Commit(hd)
		}},
		{"abort after commit", func() error {
			hd := put(t, h, arena, key(1, 12), 4096)
			return h.Abort(hd)
		}},
		{"abort twice", func() error {
			hd, _ := h.Reserve(key(1, 13), 4096)
			if err := h.Abort(hd); err != nil {
				t.Fatal(err)
			}
			return h.Abort(hd)
		}},
		{"release without lease", func() error {
			hd := put(t, h, arena, key(1, 14), 4096)
			return h.Release(hd)
		}},
		{"double release", func() error {
			hd, ok := h.Acquire(key(1, 14))
			if !ok {
				t.Fatal("miss")
			}
			if err := h.Release(hd); err != nil {
				t.Fatal(err)
			}
			return h.Release(hd)
		}},
		{"release of reservation", func() error {
			hd, _ := h.Reserve(key(1, 15), 4096)
			defer h.Abort(hd)
			return h.Release(hd)
		}},
		{"nil commit", func() error { return h.Commit(nil) }},
		{"nil release", func() error { return h.Release(nil) }},
		{"foreign commit", func() error { return h.Commit(foreign) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.run(); !errors.Is(err, ErrHandleState) {
				t.Fatalf("err = %v, want ErrHandleState", err)
			}
			mustCheck(t, h)
		})
	}
}

func TestLRUEvictionOrder(t *testing.T) {
	// One slab of four 4 KiB slots.
	h, arena := newHost(t, 16<<10, 1)
	for i := uint64(0); i < 4; i++ {
		put(t, h, arena, key(1, i), 4096)
	}
	// Access order now: 0 1 2 3. Touch 1 by lease, 2 by lookup.
	hd, _ := h.Acquire(key(1, 1))
	if err := h.Release(hd); err != nil {
		t.Fatal(err)
	}
	if n := h.Lookup([]Key{key(1, 2)}, make([]shm.Tier, 1)); n != 1 {
		t.Fatal(n)
	}
	// LRU order: 0 3 1 2.
	for i, want := range []uint64{0, 3, 1, 2} {
		put(t, h, arena, key(2, uint64(i)), 4096)
		if _, ok := h.Acquire(key(1, want)); ok {
			t.Fatalf("step %d: expected %d evicted", i, want)
		}
		mustCheck(t, h)
	}
	if st := h.Stats(); st.Evictions != 4 {
		t.Fatalf("evictions %d", st.Evictions)
	}
}

func TestLookupKeepsChainHeadNewest(t *testing.T) {
	h, arena := newHost(t, 16<<10, 1)
	chain := []Key{key(1, 0), key(1, 1), key(1, 2)}
	for i := len(chain) - 1; i >= 0; i-- {
		put(t, h, arena, chain[i], 4096)
	}
	put(t, h, arena, key(1, 99), 4096) // newest before the lookup
	tiers := make([]shm.Tier, 4)
	if n := h.Lookup(append(chain, key(1, 50)), tiers); n != 3 || tiers[2] != shm.TierHost || tiers[3] != shm.TierNone {
		t.Fatalf("lookup = %d %v", n, tiers)
	}
	// Eviction order: 99 (not looked up), then the chain from its tail.
	for i, want := range []Key{key(1, 99), chain[2], chain[1], chain[0]} {
		put(t, h, arena, key(2, uint64(i)), 4096)
		if _, ok := h.Acquire(want); ok {
			t.Fatalf("step %d: %v not evicted", i, want)
		}
	}
}

func TestPinnedNeverEvicted(t *testing.T) {
	h, arena := newHost(t, 16<<10, 2)
	var hds []*Handle
	for i := uint64(0); i < 8; i++ {
		put(t, h, arena, key(1, i), 4096)
		hd, ok := h.Acquire(key(1, i))
		if !ok {
			t.Fatal("miss")
		}
		hds = append(hds, hd)
	}
	for _, size := range []int64{4096, 8192, 16 << 10} {
		if _, err := h.Reserve(key(2, uint64(size)), size); !errors.Is(err, ErrFull) {
			t.Fatalf("size %d: err = %v, want ErrFull", size, err)
		}
	}
	// Reservations pin too.
	if err := h.Release(hds[3]); err != nil {
		t.Fatal(err)
	}
	r, err := h.Reserve(key(2, 1), 4096) // evicts key 3, the only unleased block
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Reserve(key(2, 2), 4096); !errors.Is(err, ErrFull) {
		t.Fatalf("err = %v, want ErrFull", err)
	}
	for i, hd := range hds {
		if i == 3 {
			continue
		}
		if err := checkPattern(arena, hd, 1); err != nil {
			t.Fatal(err)
		}
		if err := h.Release(hd); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Abort(r); err != nil {
		t.Fatal(err)
	}
	if st := h.Stats(); st.Evictions != 1 || st.Leased != 0 || st.Blocks != 7 {
		t.Fatalf("stats %+v", st)
	}
	mustCheck(t, h)
}

func TestDeleteLeased(t *testing.T) {
	h, arena := newHost(t, 4096, 1) // a single slot
	put(t, h, arena, key(1, 1), 4096)
	hd, _ := h.Acquire(key(1, 1))
	hd2, _ := h.Acquire(key(1, 1))
	if !h.Delete(key(1, 1)) {
		t.Fatal("delete of leased block failed")
	}
	if h.Delete(key(1, 1)) {
		t.Fatal("second delete succeeded")
	}
	if _, ok := h.Acquire(key(1, 1)); ok {
		t.Fatal("deleted block still acquirable")
	}
	if _, err := h.Reserve(key(1, 2), 4096); !errors.Is(err, ErrFull) {
		t.Fatalf("slot of leased deleted block reused: %v", err)
	}
	if st := h.Stats(); st.Blocks != 0 || st.Leased != 1 || st.UsedBytes != 4096 {
		t.Fatalf("stats %+v", st)
	}
	if err := h.Release(hd); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Reserve(key(1, 2), 4096); !errors.Is(err, ErrFull) {
		t.Fatal("freed before the last lease")
	}
	if err := h.Release(hd2); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(hd2); !errors.Is(err, ErrHandleState) {
		t.Fatalf("release of freed block: %v", err)
	}
	if st := h.Stats(); st.SlabsFree != 1 || st.UsedBytes != 0 {
		t.Fatalf("not freed: %+v", st)
	}
	r, err := h.Reserve(key(1, 1), 4096) // the same key may come back
	if err != nil {
		t.Fatal(err)
	}
	if h.Delete(key(1, 1)) {
		t.Fatal("delete of a reservation succeeded")
	}
	if h.Delete(key(9, 9)) {
		t.Fatal("delete of absent key succeeded")
	}
	if err := h.Commit(r); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, h)
}

func TestDeleteNS(t *testing.T) {
	h, arena := newHost(t, 16<<10, 8)
	for i := uint64(0); i < 5; i++ {
		put(t, h, arena, key(1, i), 4096)
		put(t, h, arena, key(2, i), 8192)
	}
	r, _ := h.Reserve(key(1, 100), 4096)
	leased, _ := h.Acquire(key(1, 0))
	if n := h.DeleteNS(1); n != 5 {
		t.Fatalf("DeleteNS = %d", n)
	}
	if n := h.DeleteNS(1); n != 0 {
		t.Fatalf("second DeleteNS = %d", n)
	}
	if n := h.Lookup([]Key{key(2, 0), key(2, 1)}, make([]shm.Tier, 2)); n != 2 {
		t.Fatalf("other namespace affected: %d", n)
	}
	st := h.Stats()
	if st.Blocks != 5 || st.Reserved != 1 || st.Leased != 1 {
		t.Fatalf("stats %+v", st)
	}
	if err := h.Commit(r); err != nil { // the reservation survived
		t.Fatal(err)
	}
	if err := h.Release(leased); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, h)
	h.DeleteNS(1)
	h.DeleteNS(2)
	if st := h.Stats(); st.SlabsFree != st.SlabsTotal || st.UsedBytes != 0 {
		t.Fatalf("leak %+v", st)
	}
}

func TestCompactionMovesData(t *testing.T) {
	h, arena := newHost(t, 16<<10, 2) // 2 slabs x 4 slots of 4 KiB
	var hds []*Handle
	for i := uint64(0); i < 8; i++ {
		hds = append(hds, put(t, h, arena, key(1, i), 4096))
	}
	// Free two slots per slab: one slab's worth of free slots, but nobody
	// needs a slab yet, so nothing moves.
	for _, i := range []uint64{0, 4, 1, 5} {
		h.Delete(key(1, i))
	}
	if st := h.Stats(); st.SlabsFree != 0 || st.Compactions != 0 {
		t.Fatalf("eager compaction: %+v", st)
	}
	mustCheck(t, h)
	// A 16 KiB block needs a whole slab: compaction provides it, no eviction.
	big := put(t, h, arena, key(2, 0), 16<<10)
	st := h.Stats()
	if st.Compactions != 1 || st.CompactedBlocks != 2 || st.Evictions != 0 || st.SlabsFree != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, i := range []uint64{2, 3, 6, 7} {
		hd, ok := h.Acquire(key(1, i))
		if !ok || hd != hds[i] {
			t.Fatal("lost block")
		}
		if hd.Offset/(16<<10) == big.Offset/(16<<10) {
			t.Fatalf("block %d shares the drained slab", i)
		}
		if err := checkPattern(arena, hd, 1); err != nil {
			t.Fatal(err)
		}
		h.Release(hd)
	}
	if err := checkPattern(arena, big, 1); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, h)
}

func TestCompactionSkipsPinnedSlab(t *testing.T) {
	h, arena := newHost(t, 16<<10, 2)
	for i := uint64(0); i < 8; i++ {
		put(t, h, arena, key(1, i), 4096)
	}
	// Pin one block in each slab, then empty both slabs down to it (key 7
	// stays unleased beside key 4): 5 free slots, but every slab is pinned.
	a, _ := h.Acquire(key(1, 0))
	b, _ := h.Acquire(key(1, 4))
	offA, offB := a.Offset, b.Offset
	for _, i := range []uint64{1, 2, 3, 5, 6} {
		h.Delete(key(1, i))
	}
	// A slab-sized block cannot be served: compaction may not move a pinned
	// block, and the 4 KiB class owns no unpinned slab to evict from.
	if _, err := h.Reserve(key(2, 0), 16<<10); !errors.Is(err, ErrFull) {
		t.Fatalf("err = %v, want ErrFull", err)
	}
	if st := h.Stats(); st.Compactions != 0 || st.Evictions != 0 || a.Offset != offA || b.Offset != offB {
		t.Fatalf("pinned slab compacted: %+v", st)
	}
	mustCheck(t, h)
	// Releasing a lease makes its slab movable, but nothing moves until a
	// slab is needed.
	h.Release(a)
	if st := h.Stats(); st.Compactions != 0 || a.Offset != offA {
		t.Fatalf("compacted on release: %+v", st)
	}
	put(t, h, arena, key(2, 0), 16<<10)
	st := h.Stats()
	if st.Compactions != 1 || st.CompactedBlocks != 1 || st.Evictions != 0 || b.Offset != offB {
		t.Fatalf("stats %+v", st)
	}
	if a.Offset/(16<<10) != offB/(16<<10) {
		t.Fatalf("block 0 not moved beside the pinned block")
	}
	if err := checkPattern(arena, a, 1); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, h)
	h.Release(b)
}

func TestDeleteThenReserveSameClassNoCompaction(t *testing.T) {
	// 8 slabs x 4 slots. Delete half of every slab (16 slots, four slabs'
	// worth), then refill with the same size: the freed slots are reused in
	// place, with no copy and no eviction.
	h, arena := newHost(t, 16<<10, 8)
	for i := uint64(0); i < 32; i++ {
		put(t, h, arena, key(1, i), 4096)
	}
	for round := uint64(0); round < 3; round++ {
		for i := uint64(0); i < 32; i += 2 {
			if !h.Delete(key(1, i+round*100)) {
				t.Fatalf("delete %d", i+round*100)
			}
		}
		st := h.Stats()
		if st.Compactions != 0 || st.Classes[0].FreeSlots != 16 {
			t.Fatalf("round %d after delete: %+v", round, st)
		}
		mustCheck(t, h)
		for i := uint64(0); i < 32; i += 2 {
			put(t, h, arena, key(1, i+(round+1)*100), 4096)
		}
		// Keep odd keys under the next round's names.
		for i := uint64(1); i < 32; i += 2 {
			hd, ok := h.Acquire(key(1, i+round*100))
			if !ok {
				t.Fatalf("lost %d", i)
			}
			if err := checkPattern(arena, hd, 1); err != nil {
				t.Fatal(err)
			}
			h.Release(hd)
			h.Delete(key(1, i+round*100))
			put(t, h, arena, key(1, i+(round+1)*100), 4096)
		}
		st = h.Stats()
		if st.Compactions != 0 || st.Evictions != 0 || st.SlabsFree != 0 || st.Blocks != 32 {
			t.Fatalf("round %d after refill: %+v", round, st)
		}
	}
	mustCheck(t, h)
}

func TestCompactionBeforeEviction(t *testing.T) {
	// 3 slabs x 4 slots: class A (4 KiB) in two slabs, class B (8 KiB, two
	// per slab) in one. A frees one slab's worth of slots spread over both
	// of its slabs; B's blocks are the oldest. A 16 KiB Reserve must compact
	// A rather than evict B's old blocks.
	h, arena := newHost(t, 16<<10, 3)
	put(t, h, arena, key(2, 0), 8192)
	put(t, h, arena, key(2, 1), 8192)
	for i := uint64(0); i < 8; i++ {
		put(t, h, arena, key(1, i), 4096)
	}
	for _, i := range []uint64{1, 2, 5, 6} {
		h.Delete(key(1, i))
	}
	put(t, h, arena, key(3, 0), 16<<10)
	st := h.Stats()
	if st.Evictions != 0 || st.Compactions != 1 || st.CompactedBlocks != 2 {
		t.Fatalf("stats %+v", st)
	}
	// Touch the survivors, B first, so B is the oldest.
	for _, k := range []Key{key(2, 0), key(2, 1), key(1, 0), key(1, 3), key(1, 4), key(1, 7), key(3, 0)} {
		hd, ok := h.Acquire(k)
		if !ok {
			t.Fatalf("%v evicted", k)
		}
		if err := checkPattern(arena, hd, 1); err != nil {
			t.Fatal(err)
		}
		h.Release(hd)
	}
	// Now nothing is compactable: the next slab comes from evicting the
	// globally oldest class with an unpinned slab (B, one slab's worth).
	put(t, h, arena, key(3, 1), 16<<10)
	if st := h.Stats(); st.Evictions != 2 || st.Compactions != 1 {
		t.Fatalf("stats %+v", st)
	}
	for _, k := range []Key{key(2, 0), key(2, 1)} {
		if _, ok := h.Acquire(k); ok {
			t.Fatalf("%v not evicted", k)
		}
	}
	mustCheck(t, h)
}

func TestCompactionPicksCheapestSlab(t *testing.T) {
	// Two compactable classes; the drain copies the fewest bytes.
	h, arena := newHost(t, 16<<10, 5)
	for i := uint64(0); i < 8; i++ { // A: 4 KiB, two slabs
		put(t, h, arena, key(1, i), 4096)
	}
	for i := uint64(0); i < 6; i++ { // B: 2 KiB (4 KiB stride), two slabs
		put(t, h, arena, key(2, i), 2048)
	}
	// A: slab0 keeps 3, slab1 keeps 1 (4 free): draining slab1 moves 4 KiB.
	for _, i := range []uint64{0, 4, 5, 6} {
		h.Delete(key(1, i))
	}
	// B: slab0 keeps 1, slab1 keeps 1 (6 free): either drain moves 2 KiB.
	for _, i := range []uint64{1, 2, 3, 5} {
		h.Delete(key(2, i))
	}
	put(t, h, arena, key(3, 0), 16<<10) // the free slab
	put(t, h, arena, key(3, 1), 16<<10) // compacts B (2 KiB of copy)
	st := h.Stats()
	if st.Compactions != 1 || st.CompactedBlocks != 1 || st.Evictions != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, c := range st.Classes {
		if c.Size == 2048 && c.Slabs != 1 {
			t.Fatalf("class B not compacted: %+v", st.Classes)
		}
	}
	put(t, h, arena, key(3, 2), 16<<10) // then A
	if st := h.Stats(); st.Compactions != 2 || st.CompactedBlocks != 2 || st.Evictions != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, k := range []Key{key(1, 1), key(1, 2), key(1, 3), key(1, 7), key(2, 0), key(2, 4)} {
		hd, ok := h.Acquire(k)
		if !ok {
			t.Fatalf("%v lost", k)
		}
		if err := checkPattern(arena, hd, 1); err != nil {
			t.Fatal(err)
		}
		h.Release(hd)
	}
	mustCheck(t, h)
}

func TestCrossClassEvictionBound(t *testing.T) {
	// 2 slabs x 4 slots of 4 KiB, LRU alternating between slabs: freeing a
	// slab for a 16 KiB block must take exactly spp=4 evictions plus one
	// compaction, not the whole class.
	h, arena := newHost(t, 16<<10, 2)
	for i := uint64(0); i < 8; i++ {
		put(t, h, arena, key(1, i), 4096)
	}
	for _, i := range []uint64{0, 4, 1, 5, 2, 6, 3, 7} { // LRU → MRU
		hd, _ := h.Acquire(key(1, i))
		h.Release(hd)
	}
	put(t, h, arena, key(2, 0), 16<<10)
	st := h.Stats()
	if st.Evictions != 4 || st.Compactions != 1 || st.CompactedBlocks != 2 {
		t.Fatalf("stats %+v", st)
	}
	for _, i := range []uint64{2, 6, 3, 7} {
		hd, ok := h.Acquire(key(1, i))
		if !ok {
			t.Fatalf("%d evicted", i)
		}
		if err := checkPattern(arena, hd, 1); err != nil {
			t.Fatal(err)
		}
		h.Release(hd)
	}
	mustCheck(t, h)
}

func TestFullestSlabFirst(t *testing.T) {
	h, arena := newHost(t, 16<<10, 3)
	var hds []*Handle
	for i := uint64(0); i < 8; i++ {
		hds = append(hds, put(t, h, arena, key(1, i), 4096))
	}
	slabOf := func(hd *Handle) int64 { return hd.Offset / (16 << 10) }
	// Slab of block 0 keeps 3 live, slab of block 4 keeps 2.
	h.Delete(key(1, 0))
	h.Delete(key(1, 4))
	h.Delete(key(1, 5))
	hd := put(t, h, arena, key(1, 100), 4096)
	if slabOf(hd) != slabOf(hds[1]) {
		t.Fatalf("allocated in slab %d, want the fuller slab %d", slabOf(hd), slabOf(hds[1]))
	}
	mustCheck(t, h)
}

func TestStatsClasses(t *testing.T) {
	arena := make([]byte, 4*(10<<10))
	h, err := NewHost(arena, HostConfig{SlabBytes: 10 << 10, Align: 1024})
	if err != nil {
		t.Fatal(err)
	}
	put(t, h, arena, key(1, 1), 3000)
	put(t, h, arena, key(1, 2), 3000)
	put(t, h, arena, key(2, 1), 1)
	st := h.Stats()
	want := []ClassStats{
		{Size: 1, Stride: 1024, SlotsPerSlab: 10, Slabs: 1, Blocks: 1, FreeSlots: 9},
		{Size: 3000, Stride: 3072, SlotsPerSlab: 3, Slabs: 1, Blocks: 2, FreeSlots: 1},
	}
	if fmt.Sprint(st.Classes) != fmt.Sprint(want) {
		t.Fatalf("classes %+v, want %+v", st.Classes, want)
	}
	if st.UsedBytes != 6001 || st.CapacityBytes != 40<<10 || st.SlabsFree != 2 || st.Blocks != 3 {
		t.Fatalf("stats %+v", st)
	}
	h.Acquire(key(1, 1))
	h.Acquire(key(9, 9))
	if st := h.Stats(); st.Hits != 1 || st.Misses != 1 || st.Leased != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConcurrent(t *testing.T) {
	const workers = 8
	h, arena := newHost(t, 64<<10, 16)
	shared := make([]Key, 8)
	for i := range shared {
		shared[i] = key(100, uint64(i))
		put(t, h, arena, shared[i], 4096)
	}
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns := uint32(w)
			size := int64(4096 * (1 + w%3))
			tiers := make([]shm.Tier, len(shared))
			for i := 0; i < 3000; i++ {
				k := key(ns, uint64(i%200))
				hd, err := h.Reserve(k, size)
				switch {
				case err == nil:
					if i%5 == 0 {
						err = h.Abort(hd)
					} else {
						err = h.Commit(hd)
					}
				case errors.Is(err, ErrExists), errors.Is(err, ErrFull):
					err = nil
				}
				if err != nil {
					errc <- err
					return
				}
				if hd, ok := h.Acquire(key(ns, uint64((i*7)%200))); ok {
					if hd.Size != size {
						errc <- fmt.Errorf("size %d", hd.Size)
						return
					}
					if err := h.Release(hd); err != nil {
						errc <- err
						return
					}
				}
				if hd, ok := h.Acquire(shared[i%len(shared)]); ok {
					if err := checkPattern(arena, hd, 1); err != nil {
						errc <- err
						return
					}
					if err := h.Release(hd); err != nil {
						errc <- err
						return
					}
				}
				h.Lookup(shared, tiers)
				if i%11 == 0 {
					h.Delete(key(ns, uint64((i*3)%200)))
				}
				if i%500 == 0 {
					h.Stats()
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	mustCheck(t, h)
	for ns := uint32(0); ns <= 100; ns++ {
		h.DeleteNS(ns)
	}
	if st := h.Stats(); st.SlabsFree != st.SlabsTotal || st.UsedBytes != 0 {
		t.Fatalf("leak %+v", st)
	}
}
