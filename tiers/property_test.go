package tiers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/shm"
)

// mblock is the test's model of one block.
type mblock struct {
	hd     *Handle
	size   int64
	state  blockState // reserved, committed, deleted (deleted: leased, out of index)
	leases int
	nonce  uint64
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// patternStep spaces the checked words; sparse enough for 3 MiB blocks under
// -race, dense enough that a wrong or partial memmove cannot pass.
const patternStep = 512

func patternWord(k Key, nonce uint64, pos int64) uint64 {
	return splitmix(k.Hash.Lo ^ k.Hash.Hi<<1 ^ uint64(k.NS)<<40 ^ nonce*0x2545f4914f6cdd1d ^ uint64(pos))
}

func patternPositions(size int64, f func(pos int64)) {
	if size < 8 {
		f(0)
		return
	}
	for p := int64(0); p+8 <= size; p += patternStep {
		f(p)
	}
	f(size - 8)
}

func writePattern(arena []byte, hd *Handle, nonce uint64) {
	b := arena[hd.Offset : hd.Offset+hd.Size]
	if hd.Size < 8 {
		for i := range b {
			b[i] = byte(patternWord(hd.Key, nonce, int64(i)))
		}
		return
	}
	patternPositions(hd.Size, func(p int64) {
		binary.LittleEndian.PutUint64(b[p:], patternWord(hd.Key, nonce, p))
	})
}

func checkPattern(arena []byte, hd *Handle, nonce uint64) error {
	b := arena[hd.Offset : hd.Offset+hd.Size]
	if hd.Size < 8 {
		for i := range b {
			if b[i] != byte(patternWord(hd.Key, nonce, int64(i))) {
				return fmt.Errorf("block %v byte %d corrupted", hd.Key, i)
			}
		}
		return nil
	}
	var err error
	patternPositions(hd.Size, func(p int64) {
		if err == nil && binary.LittleEndian.Uint64(b[p:]) != patternWord(hd.Key, nonce, p) {
			err = fmt.Errorf("block %v (off %d) word at %d corrupted", hd.Key, hd.Offset, p)
		}
	})
	return err
}

type propCase struct {
	name      string
	slabBytes int64
	align     int64
	slabs     int
	sizes     []int64 // namespace i uses sizes[i]
	keys      int     // distinct hashes per namespace
	ops       int
}

func TestHostRandomized(t *testing.T) {
	cases := []propCase{
		{"mixed-MiB", 4 << 20, 4096, 10, []int64{4 << 10, 64 << 10, 2 << 20, 3<<20 + 123}, 800, 12000},
		{"mixed-small", 64 << 10, 4096, 32, []int64{4096, 8192, 12293, 64 << 10}, 200, 25000},
		{"odd-align", 16 << 10, 512, 24, []int64{100, 512, 3000, 5000, 16 << 10, 1}, 150, 25000},
		{"one-class", 64 << 10, 4096, 8, []int64{4096}, 300, 25000},
		{"two-close", 32 << 10, 4096, 16, []int64{8192, 8193, 4000}, 200, 25000},
	}
	seeds := []uint64{1, 2, 3}
	scale := 1
	if testing.Short() {
		seeds = seeds[:1]
	}
	if raceEnabled {
		scale = 4
	}
	for _, pc := range cases {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("%s/seed%d", pc.name, seed), func(t *testing.T) {
				pc := pc
				pc.ops /= scale
				runProp(t, pc, seed)
			})
		}
	}
}

func runProp(t *testing.T, pc propCase, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed*7919+1))
	arena := make([]byte, int64(pc.slabs)*pc.slabBytes)
	h, err := NewHost(arena, HostConfig{SlabBytes: pc.slabBytes, Align: pc.align})
	if err != nil {
		t.Fatal(err)
	}
	model := map[Key]*mblock{} // reserved and committed blocks
	var pending []*mblock      // reservations held by "the test client"
	var holds []*mblock        // one entry per lease
	var nonce uint64
	var lastEvictions, lastCompactions uint64
	counts := map[string]int{}

	randKey := func() Key {
		ns := rng.IntN(len(pc.sizes))
		return Key{NS: uint32(ns), Hash: shm.Hash{Hi: uint64(ns) * 1000003, Lo: uint64(rng.IntN(pc.keys))}}
	}
	removeAt := func(s []*mblock, i int) []*mblock {
		s[i] = s[len(s)-1]
		return s[:len(s)-1]
	}

	// syncEvictions drops from the model the blocks the allocator evicted and
	// checks the eviction bound of one Reserve of class c.
	syncEvictions := func(op string, c *class) {
		st := h.Stats()
		delta := st.Evictions - lastEvictions
		lastEvictions = st.Evictions
		if delta == 0 {
			return
		}
		if c == nil {
			t.Fatalf("%s evicted %d blocks; only Reserve may evict", op, delta)
		}
		var same int
		var other int64
		otherClasses := map[int64]bool{}
		var n uint64
		for k, b := range model {
			if b.state != stateCommitted {
				continue
			}
			h.mu.Lock()
			present := h.index[k] == b.hd
			h.mu.Unlock()
			if present {
				continue
			}
			if b.leases > 0 {
				t.Fatalf("leased block %v evicted", k)
			}
			delete(model, k)
			n++
			if b.size == c.size {
				same++
			} else {
				other += b.size
				otherClasses[b.size] = true
			}
		}
		if n != delta {
			t.Fatalf("evictions counter +%d, model lost %d", delta, n)
		}
		if same > 1 || (same == 1 && other > 0) || len(otherClasses) > 1 || other > pc.slabBytes {
			t.Fatalf("reserve of %d evicted %d same-class blocks and %d bytes of %d other classes", c.size, same, other, len(otherClasses))
		}
		counts["evictions"] += int(n)
	}

	for i := 0; i < pc.ops; i++ {
		r := rng.IntN(1000)
		var op string
		var rc *class
		switch {
		case r < 300: // reserve
			op = "reserve"
			k := randKey()
			size := pc.sizes[k.NS]
			pre := capturePressure(h, size)
			hd, err := h.Reserve(k, size)
			if err := checkPressure(h, pre, err); err != nil {
				t.Fatalf("op %d: reserve of %d: %v", i, size, err)
			}
			_, exists := model[k]
			switch {
			case exists:
				if !errors.Is(err, ErrExists) {
					t.Fatalf("op %d: reserve of present %v: %v", i, k, err)
				}
			case errors.Is(err, ErrFull):
				counts["full"]++
				if err := checkFull(h, size); err != nil {
					t.Fatalf("op %d: ErrFull but %v", i, err)
				}
			case err != nil:
				t.Fatalf("op %d: reserve: %v", i, err)
			default:
				if hd.Key != k || hd.Size != size {
					t.Fatalf("bad handle %+v", hd)
				}
				b := &mblock{hd: hd, size: size, state: stateReserved}
				model[k] = b
				pending = append(pending, b)
			}
			h.mu.Lock()
			rc = h.classes[size]
			h.mu.Unlock()
		case r < 500: // commit
			op = "commit"
			if len(pending) == 0 {
				continue
			}
			j := rng.IntN(len(pending))
			b := pending[j]
			pending = removeAt(pending, j)
			nonce++
			b.nonce = nonce
			writePattern(arena, b.hd, b.nonce) // we hold the reservation: Offset is stable
			if err := h.Commit(b.hd); err != nil {
				t.Fatalf("op %d: commit: %v", i, err)
			}
			b.state = stateCommitted
		case r < 540: // abort
			op = "abort"
			if len(pending) == 0 {
				continue
			}
			j := rng.IntN(len(pending))
			b := pending[j]
			pending = removeAt(pending, j)
			if err := h.Abort(b.hd); err != nil {
				t.Fatalf("op %d: abort: %v", i, err)
			}
			delete(model, b.hd.Key)
		case r < 720: // acquire
			op = "acquire"
			if len(holds) > 24 {
				continue
			}
			k := randKey()
			if rng.IntN(2) == 0 { // bias toward hits so moved data gets checked
				for mk := range model {
					k = mk
					break
				}
			}
			hd, ok := h.Acquire(k)
			b := model[k]
			want := b != nil && b.state == stateCommitted
			if ok != want {
				t.Fatalf("op %d: acquire %v = %v, model says %v", i, k, ok, want)
			}
			if ok {
				if hd != b.hd {
					t.Fatalf("acquire returned another handle")
				}
				if err := checkPattern(arena, hd, b.nonce); err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
				b.leases++
				holds = append(holds, b)
				counts["hits"]++
			}
		case r < 880: // release
			op = "release"
			if len(holds) == 0 {
				continue
			}
			j := rng.IntN(len(holds))
			b := holds[j]
			holds = removeAt(holds, j)
			if err := checkPattern(arena, b.hd, b.nonce); err != nil {
				t.Fatalf("op %d: leased block changed: %v", i, err)
			}
			if err := h.Release(b.hd); err != nil {
				t.Fatalf("op %d: release: %v", i, err)
			}
			b.leases--
		case r < 940: // delete
			op = "delete"
			k := randKey()
			b := model[k]
			want := b != nil && b.state == stateCommitted
			if got := h.Delete(k); got != want {
				t.Fatalf("op %d: delete %v = %v, want %v", i, k, got, want)
			}
			if want {
				delete(model, k)
				b.state = stateDeleted
			}
		case r < 942: // delete namespace
			op = "deletens"
			ns := uint32(rng.IntN(len(pc.sizes)))
			want := 0
			for k, b := range model {
				if k.NS == ns && b.state == stateCommitted {
					want++
					delete(model, k)
					b.state = stateDeleted
				}
			}
			if got := h.DeleteNS(ns); got != want {
				t.Fatalf("op %d: DeleteNS = %d, want %d", i, got, want)
			}
		case r < 985: // lookup
			op = "lookup"
			n := 1 + rng.IntN(8)
			chain := make([]Key, n)
			tiers := make([]shm.Tier, n)
			want := -1
			for j := range chain {
				chain[j] = randKey()
				if b := model[chain[j]]; want < 0 && (b == nil || b.state != stateCommitted) {
					want = j
				}
			}
			if want < 0 {
				want = n
			}
			if got := h.Lookup(chain, tiers); got != want {
				t.Fatalf("op %d: lookup = %d, want %d", i, got, want)
			}
			for j := 0; j < want; j++ {
				if tiers[j] != shm.TierHost {
					t.Fatalf("tier %d = %v", j, tiers[j])
				}
			}
		default: // misuse must fail without side effects
			op = "misuse"
			for _, b := range model {
				if b.state == stateCommitted {
					if err := h.Commit(b.hd); err == nil {
						t.Fatalf("commit of committed block succeeded")
					}
					if err := h.Abort(b.hd); err == nil {
						t.Fatalf("abort of committed block succeeded")
					}
					if b.leases == 0 {
						if err := h.Release(b.hd); err == nil {
							t.Fatalf("release without lease succeeded")
						}
					}
				} else if b.state == stateReserved {
					if err := h.Release(b.hd); err == nil {
						t.Fatalf("release of reservation succeeded")
					}
				}
				break
			}
		}
		counts[op]++
		syncEvictions(op, rc)
		if st := h.Stats(); st.Compactions != lastCompactions {
			if rc == nil {
				t.Fatalf("op %d: %s compacted; only a Reserve that needs a slab may", i, op)
			}
			counts["compacting reserves"]++
			lastCompactions = st.Compactions
			for _, b := range model { // moved blocks kept their bytes
				if b.state == stateCommitted {
					if err := checkPattern(arena, b.hd, b.nonce); err != nil {
						t.Fatalf("op %d: after compaction: %v", i, err)
					}
				}
			}
		}
		if err := checkHost(h); err != nil {
			t.Fatalf("op %d (%s): invariant: %v", i, op, err)
		}
		compareModel(t, h, model, holds, i)
	}

	// Drain: every committed block still holds its data; then nothing leaks.
	for _, b := range model {
		if b.state == stateCommitted {
			hd, ok := h.Acquire(b.hd.Key)
			if !ok {
				t.Fatalf("committed %v missing at drain", b.hd.Key)
			}
			if err := checkPattern(arena, hd, b.nonce); err != nil {
				t.Fatal(err)
			}
			if err := h.Release(hd); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, b := range holds {
		if err := h.Release(b.hd); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range pending {
		if err := h.Abort(b.hd); err != nil {
			t.Fatal(err)
		}
	}
	for ns := range pc.sizes {
		h.DeleteNS(uint32(ns))
	}
	if err := checkHost(h); err != nil {
		t.Fatal(err)
	}
	st := h.Stats()
	if st.SlabsFree != st.SlabsTotal || st.UsedBytes != 0 || st.Blocks != 0 || st.Reserved != 0 || st.Leased != 0 {
		t.Fatalf("leak after drain: %+v", st)
	}
	if counts["evictions"] == 0 {
		t.Errorf("case never evicted; it does not exercise pressure")
	}
	if len(pc.sizes) > 1 && st.Compactions == 0 {
		t.Errorf("multi-class case never compacted; it does not exercise compaction")
	}
	if len(pc.sizes) == 1 && st.Compactions != 0 {
		t.Errorf("one-class case compacted %d times; compaction cannot help a single class", st.Compactions)
	}
	t.Logf("ops %v; compactions %d moved %d", counts, st.Compactions, st.CompactedBlocks)
}

// checkFull verifies that an ErrFull was justified: the class has no free
// slot, no slab is free, the class has nothing unleased to evict, and no
// other class owns a slab free of pinned blocks.
func checkFull(h *Host, size int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.classes[size]
	switch {
	case len(h.pool) > 0:
		return fmt.Errorf("%d free slabs", len(h.pool))
	case c != nil && c.freeSlots() > 0:
		return fmt.Errorf("class has %d free slots", c.freeSlots())
	case c != nil && c.lru.n > 0:
		return fmt.Errorf("class has %d evictable blocks", c.lru.n)
	}
	for _, d := range h.classList {
		if d != c && d.unpinned > 0 {
			return fmt.Errorf("class %d has %d unpinned slabs", d.size, d.unpinned)
		}
	}
	return nil
}

func compareModel(t *testing.T, h *Host, model map[Key]*mblock, holds []*mblock, op int) {
	t.Helper()
	var used int64
	committed, reserved := 0, 0
	leasedSet := map[*mblock]bool{}
	for _, b := range model {
		used += b.size
		if b.state == stateCommitted {
			committed++
		} else {
			reserved++
		}
	}
	for _, b := range holds {
		if !leasedSet[b] && b.state == stateDeleted {
			used += b.size
		}
		leasedSet[b] = true
	}
	st := h.Stats()
	slabs, blocks := st.SlabsFree, 0
	for _, c := range st.Classes {
		slabs += c.Slabs
		blocks += c.Blocks
		if c.FreeSlots != c.Slabs*c.SlotsPerSlab-c.Blocks {
			t.Fatalf("op %d: class %d free slots %d", op, c.Size, c.FreeSlots)
		}
	}
	if st.UsedBytes != used || st.Blocks != committed || st.Reserved != reserved || st.Leased != len(leasedSet) ||
		slabs != st.SlabsTotal || st.SlabsTotal != int(st.CapacityBytes/st.SlabBytes) ||
		blocks != committed+reserved+deletedLeased(leasedSet) {
		t.Fatalf("op %d: stats %+v vs model used %d committed %d reserved %d leased %d",
			op, st, used, committed, reserved, len(leasedSet))
	}
}

func deletedLeased(s map[*mblock]bool) int {
	n := 0
	for b := range s {
		if b.state == stateDeleted {
			n++
		}
	}
	return n
}
