// Random operations on the mover's pin API, checked after every step.

package tiers

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/shm"
)

// TestMoverPinProperty mixes the mover's pin API with reader leases,
// deletes and reservations under pressure, checking every invariant.
func TestMoverPinProperty(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, seed*31+7))
			sizes := []int64{4096, 8192, 12293, 64 << 10}
			slabBytes := int64(64 << 10)
			arena := make([]byte, slabBytes*24)
			h, err := NewHost(arena, HostConfig{SlabBytes: slabBytes})
			if err != nil {
				t.Fatal(err)
			}
			removed := map[Key]int{}
			live := map[Key]bool{}
			h.SetOnRemove(func(k Key) {
				if !live[k] {
					t.Fatalf("onRemove of %v not live", k)
				}
				delete(live, k)
				removed[k]++
			})
			type hold struct {
				hd    *Handle
				nonce uint64
			}
			var pending []*Handle
			var holds []hold
			nonces := map[*Handle]uint64{}
			var nonce uint64
			randKey := func() Key {
				ns := rng.IntN(len(sizes))
				return Key{NS: uint32(ns), Hash: shm.Hash{Hi: uint64(ns), Lo: uint64(rng.IntN(150))}}
			}
			addHold := func(hd *Handle) {
				if err := checkPattern(arena, hd, nonces[hd]); err != nil {
					t.Fatal(err)
				}
				holds = append(holds, hold{hd, nonces[hd]})
			}
			for i := 0; i < 10000; i++ {
				switch r := rng.IntN(100); {
				case r < 25:
					k := randKey()
					hd, err := h.Reserve(k, sizes[k.NS])
					if err == nil {
						pending = append(pending, hd)
					}
				case r < 40:
					if len(pending) == 0 {
						continue
					}
					j := rng.IntN(len(pending))
					hd := pending[j]
					pending = append(pending[:j], pending[j+1:]...)
					nonce++
					nonces[hd] = nonce
					writePattern(arena, hd, nonce)
					if rng.IntN(3) == 0 {
						if err := h.CommitPinned(hd); err != nil {
							t.Fatal(err)
						}
						live[hd.Key] = true
						addHold(hd)
					} else if err := h.Commit(hd); err != nil {
						t.Fatal(err)
					} else {
						live[hd.Key] = true
					}
				case r < 43:
					if len(pending) == 0 {
						continue
					}
					j := rng.IntN(len(pending))
					if err := h.Abort(pending[j]); err != nil {
						t.Fatal(err)
					}
					pending = append(pending[:j], pending[j+1:]...)
				case r < 55:
					if len(holds) > 40 {
						continue
					}
					k := randKey()
					var hd *Handle
					var ok bool
					switch rng.IntN(3) {
					case 0:
						hd, ok = h.Acquire(k)
					case 1:
						hd, ok = h.Pin(k)
					default:
						hd, ok = h.PinUnleased(k)
					}
					if ok {
						addHold(hd)
					}
				case r < 58:
					if len(holds) > 40 {
						continue
					}
					for _, hd := range h.PinColdest(1+rng.IntN(4), func(Key) bool { return rng.IntN(3) == 0 }) {
						addHold(hd)
					}
				case r < 59:
					if len(holds) > 10 {
						continue
					}
					for _, hd := range h.PinAll() {
						addHold(hd)
					}
				case r < 80:
					if len(holds) == 0 {
						continue
					}
					j := rng.IntN(len(holds))
					hl := holds[j]
					holds = append(holds[:j], holds[j+1:]...)
					if err := checkPattern(arena, hl.hd, hl.nonce); err != nil {
						t.Fatalf("op %d: held block changed: %v", i, err)
					}
					switch rng.IntN(3) {
					case 0:
						if err := h.Release(hl.hd); err != nil {
							t.Fatal(err)
						}
					case 1:
						if _, err := h.Unpin(hl.hd, false); err != nil {
							t.Fatal(err)
						}
					default:
						if _, err := h.Unpin(hl.hd, true); err != nil {
							t.Fatal(err)
						}
					}
				case r < 90:
					h.Delete(randKey())
				case r < 91:
					h.DeleteNS(uint32(rng.IntN(len(sizes))))
				default:
					chain := []Key{randKey(), randKey(), randKey()}
					h.Lookup(chain, make([]shm.Tier, 3))
				}
				if err := checkHost(h); err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
				h.mu.Lock()
				nc := 0
				for k, hd := range h.index {
					if hd.state == stateCommitted {
						nc++
						if !live[k] {
							t.Fatalf("op %d: committed %v missing from onRemove model", i, k)
						}
					}
				}
				h.mu.Unlock()
				if nc != len(live) {
					t.Fatalf("op %d: onRemove model %d keys, index %d committed", i, len(live), nc)
				}
			}
			held := make([]*Handle, len(holds))
			for j, hl := range holds {
				held[j] = hl.hd
			}
			st := emptyHost(t, h, held, pending, len(sizes))
			t.Logf("evictions %d compactions %d moved %d removed keys %d", st.Evictions, st.Compactions, st.CompactedBlocks, len(removed))
		})
	}
}

// emptyHost releases held, aborts pending, deletes namespaces 0..nss-1,
// checks the allocator's invariants and that nothing is left (no leak),
// and returns the final stats.
func emptyHost(t *testing.T, h *Host, held, pending []*Handle, nss int) HostStats {
	t.Helper()
	for _, hd := range held {
		if err := h.Release(hd); err != nil {
			t.Fatal(err)
		}
	}
	for _, hd := range pending {
		if err := h.Abort(hd); err != nil {
			t.Fatal(err)
		}
	}
	for ns := range nss {
		h.DeleteNS(uint32(ns))
	}
	mustCheck(t, h)
	st := h.Stats()
	if st.SlabsFree != st.SlabsTotal || st.UsedBytes != 0 || st.Leased != 0 || st.Blocks != 0 || st.Reserved != 0 {
		t.Fatalf("leak: %+v", st)
	}
	return st
}
