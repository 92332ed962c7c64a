package tiers

import (
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
)

// TestPromotedChainKeepsItsPlaceInPolicy: blocks promoted from NVMe by a
// lookup enter the replacement policy with their place in the looked-up
// chain, as the simulator inserts them (the same policy, the same
// references). With the chain-aware policy the demoter then takes the
// chain's tail first; a promoted block inserted without its parent is a
// root of its own, and the head, promoted first, went back down first,
// which leaves the rest of the prefix unreachable.
func TestPromotedChainKeepsItsPlaceInPolicy(t *testing.T) {
	const bs, n = 64 << 10, 4
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{Policy: "chain", PromoteWorkers: 1}})
	chain := make([]Key, n)
	for i := range chain {
		chain[i] = chainKey(71, uint64(i))
		r.putNVMe(t, chain[i], bs)
	}
	tiers := make([]shm.Tier, n)
	if hits, _ := r.c.Lookup(chain, tiers); hits != n {
		t.Fatalf("lookup found %d of %d in nvme", hits, n)
	}
	r.start()
	eventually(t, 5*time.Second, "chain not promoted into the policy", func() bool {
		r.c.pmu.Lock()
		defer r.c.pmu.Unlock()
		return r.c.Stats().Promoted == n && r.c.pol.Len() == n
	})
	r.c.demoteMu.Lock()
	moved := r.c.demoteBatch(1)
	r.c.demoteMu.Unlock()
	if moved != 1 {
		t.Fatalf("demoted %d blocks, want 1", moved)
	}
	for i, k := range chain {
		if want := i < n-1; r.h.Contains(k) != want {
			t.Fatalf("after demoting one block of a promoted chain: block %d in the host tier %v, want %v (the tail goes first)",
				i, r.h.Contains(k), want)
		}
	}
}
