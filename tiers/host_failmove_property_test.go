package tiers

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/shm"
)

// TestHostFailedMoveProperty drives compaction with a Move hook that fails
// at random (the GPU allocator's D2D copy): a failed move drops the block.
// After every step the allocator's invariants (checkHost), the onRemove
// model and the bytes of every committed block are checked.
func TestHostFailedMoveProperty(t *testing.T) {
	moves, failed := 0, 0
	for _, noEvict := range []bool{false, true} {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("noEvict=%v/%d", noEvict, seed), func(t *testing.T) {
				m, f := runFailedMoveProp(t, noEvict, seed)
				moves, failed = moves+m, failed+f
			})
		}
	}
	if failed == 0 || moves == failed {
		t.Fatalf("moves %d, failed %d: the test did not exercise both outcomes", moves, failed)
	}
}

func runFailedMoveProp(t *testing.T, noEvict bool, seed uint64) (moves, failed int) {
	rng := rand.New(rand.NewPCG(seed, seed*131+9))
	sizes := []int64{4096, 8192, 12293, 20000, 64 << 10}
	slabBytes := int64(64 << 10)
	arena := make([]byte, slabBytes*16)
	var h *Host
	failRate := 0
	move := func(dst, src, n int64) error {
		moves++
		if rng.IntN(100) < failRate {
			failed++
			return errors.New("injected move failure")
		}
		copy(arena[dst:dst+n], arena[src:src+n])
		return nil
	}
	h, err := NewHost(arena, HostConfig{SlabBytes: slabBytes, Move: move, NoEvict: noEvict})
	if err != nil {
		t.Fatal(err)
	}
	live := map[Key]*Handle{}
	h.SetOnRemove(func(k Key) {
		if live[k] == nil {
			t.Fatalf("onRemove of %v not live", k)
		}
		delete(live, k)
	})
	nonces := map[*Handle]uint64{}
	var nonce uint64
	var pending, holds []*Handle
	randKey := func() Key {
		ns := rng.IntN(len(sizes))
		return Key{NS: uint32(ns), Hash: shm.Hash{Hi: uint64(ns), Lo: uint64(rng.IntN(120))}}
	}
	for i := 0; i < 8000; i++ {
		failRate = []int{0, 30, 100}[rng.IntN(3)]
		switch r := rng.IntN(100); {
		case r < 35:
			k := randKey()
			if hd, err := h.Reserve(k, sizes[k.NS]); err == nil {
				pending = append(pending, hd)
			}
		case r < 55:
			if len(pending) == 0 {
				continue
			}
			j := rng.IntN(len(pending))
			hd := pending[j]
			pending = append(pending[:j], pending[j+1:]...)
			nonce++
			nonces[hd] = nonce
			writePattern(arena, hd, nonce)
			if err := h.Commit(hd); err != nil {
				t.Fatal(err)
			}
			live[hd.Key] = hd
		case r < 58:
			if len(pending) == 0 {
				continue
			}
			j := rng.IntN(len(pending))
			if err := h.Abort(pending[j]); err != nil {
				t.Fatal(err)
			}
			pending = append(pending[:j], pending[j+1:]...)
		case r < 66:
			if len(holds) > 12 {
				continue
			}
			if hd, ok := h.Acquire(randKey()); ok {
				holds = append(holds, hd)
			}
		case r < 76:
			if len(holds) == 0 {
				continue
			}
			j := rng.IntN(len(holds))
			hd := holds[j]
			holds = append(holds[:j], holds[j+1:]...)
			if err := checkPattern(arena, hd, nonces[hd]); err != nil {
				t.Fatalf("op %d: held block changed: %v", i, err)
			}
			if err := h.Release(hd); err != nil {
				t.Fatal(err)
			}
		case r < 92:
			h.Delete(randKey())
		case r < 93:
			h.DeleteNS(uint32(rng.IntN(len(sizes))))
		default:
			h.Lookup([]Key{randKey(), randKey()}, make([]shm.Tier, 2))
		}
		if err := checkHost(h); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		h.mu.Lock()
		nc := 0
		for k, hd := range h.index {
			if hd.state != stateCommitted {
				continue
			}
			nc++
			if live[k] != hd {
				t.Fatalf("op %d: committed %v missing from onRemove model", i, k)
			}
			if err := checkPattern(arena, hd, nonces[hd]); err != nil {
				t.Fatalf("op %d: committed block has wrong bytes: %v", i, err)
			}
		}
		h.mu.Unlock()
		if nc != len(live) {
			t.Fatalf("op %d: onRemove model %d keys, index %d committed", i, len(live), nc)
		}
	}
	st := emptyHost(t, h, holds, pending, len(sizes))
	t.Logf("moves %d failed %d compactions %d moved %d evictions %d", moves, failed, st.Compactions, st.CompactedBlocks, st.Evictions)
	return moves, failed
}
