package tiers

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers/policy"
)

// TestFailedDemotionKeepsPlaceInPolicy: a demotion victim whose NVMe write
// fails stays in the host tier and keeps its place in the chain-aware
// policy's prefix tree. Handed back as a block of unknown place, the tail
// of a chain became a parentless root and its parent a leaf, so the next
// victim was the parent, a block with a resident child (the leaf-only rule
// broken, the tail cut off from its prefix).
func TestFailedDemotionKeepsPlaceInPolicy(t *testing.T) {
	for _, tt := range []struct {
		pol   string
		batch int // blocks the failed pass takes: the tail, then its parent
	}{
		{"chain", 1}, {"chain", 2}, {"density", 1}, {"density", 2},
	} {
		pol := tt.pol
		t.Run(fmt.Sprintf("%s/%d", tt.pol, tt.batch), func(t *testing.T) {
			const bs, n = 64 << 10, 5
			r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20,
				cfg: ChainConfig{Policy: pol}})
			chain := make([]Key, n)
			for i := range chain {
				chain[i] = chainKey(91, uint64(i))
				hd, err := r.c.Reserve(chain[i], bs)
				if err != nil {
					t.Fatal(err)
				}
				fillFor(r.h.Bytes(hd), chain[i])
				if err := r.h.Commit(hd); err != nil {
					t.Fatal(err)
				}
				r.c.Inserted(chain[i], ChainInfo(chain, i, 1, 0))
			}
			polLen := func() int {
				r.c.pmu.Lock()
				defer r.c.pmu.Unlock()
				return r.c.pol.Len()
			}
			eventually(t, 5*time.Second, "chain not in the policy", func() bool { return polLen() == n })
			if err := r.store.Close(); err != nil { // every write fails from here on
				t.Fatal(err)
			}
			r.c.demoteMu.Lock()
			moved := r.c.demoteBatch(tt.batch)
			r.c.demoteMu.Unlock()
			if moved != 0 {
				t.Fatalf("demoted %d blocks to a closed store", moved)
			}
			for _, k := range chain {
				if !r.h.Contains(k) {
					t.Fatalf("block %v left the host tier after a failed write", k)
				}
			}
			eventually(t, 5*time.Second, "victim not tracked again", func() bool { return polLen() == n })
			// Let the mover's events settle, then ask the policy.
			eventually(t, 5*time.Second, "policy events not applied", func() bool { return len(r.c.polCh) == 0 })
			r.c.pmu.Lock()
			// A reference to the tail (its parent's too, but the chain is
			// no older for it): still the only leaf, it is the victim.
			r.c.pol.Access(pk(chain[n-1]), policy.AccessInfo{})
			v, ok := r.c.pol.Victim()
			r.c.pmu.Unlock()
			if !ok || v != pk(chain[n-1]) {
				got := -1
				for i, k := range chain {
					if pk(k) == v {
						got = i
					}
				}
				t.Fatalf("%s: after a failed demotion of the tail, the next victim is block %d (ok %v), want the tail %d: the only leaf",
					pol, got, ok, n-1)
			}
		})
	}
}

// TestLeasedVictimsKeepPlaceInPolicy: demotion victims a reader holds
// leases on (a reader leases a chain's blocks together) stay in the host
// tier and keep their places in the chain-aware policy's prefix tree.
// pinVictims handed each back as it met it, the tail first: applied after
// its parent had left the policy as the next victim, the tail went back
// as a parentless root and the parent, handed back next, as a leaf with a
// resident child, the leaf-only rule broken.
func TestLeasedVictimsKeepPlaceInPolicy(t *testing.T) {
	for _, pol := range []string{"chain", "density"} {
		t.Run(pol, func(t *testing.T) {
			const bs, n = 64 << 10, 4
			r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true,
				cfg: ChainConfig{Policy: pol}})
			c, h := r.c, r.h
			chain := make([]Key, n)
			for i := range chain {
				chain[i] = chainKey(92, uint64(i))
				hd, err := c.Reserve(chain[i], bs)
				if err != nil {
					t.Fatal(err)
				}
				fillFor(h.Bytes(hd), chain[i])
				if err := h.Commit(hd); err != nil {
					t.Fatal(err)
				}
			}
			drain := func() {
				c.pmu.Lock()
				defer c.pmu.Unlock()
				for len(c.polCh) > 0 {
					c.apply(<-c.polCh)
				}
			}
			for i := range chain {
				c.Inserted(chain[i], ChainInfo(chain, i, 1, 0))
			}
			drain()
			var leases []*Handle
			for _, k := range chain {
				hd, ok := h.Acquire(k)
				if !ok {
					t.Fatalf("acquire %v", k)
				}
				leases = append(leases, hd)
			}
			c.demoteMu.Lock()
			moved := c.demoteBatch(n)
			c.demoteMu.Unlock()
			if moved != 0 {
				t.Fatalf("demoted %d leased blocks", moved)
			}
			for _, hd := range leases {
				if err := h.Release(hd); err != nil {
					t.Fatal(err)
				}
			}
			drain()
			c.pmu.Lock()
			defer c.pmu.Unlock()
			if got := c.pol.Len(); got != n {
				t.Fatalf("policy tracks %d blocks after the pass, want %d", got, n)
			}
			c.pol.Access(pk(chain[n-1]), policy.AccessInfo{})
			v, ok := c.pol.Victim()
			if !ok || v != pk(chain[n-1]) {
				got := -1
				for i, k := range chain {
					if pk(k) == v {
						got = i
					}
				}
				t.Fatalf("%s: after a pass over a leased chain, the next victim is block %d (ok %v), want the tail %d: the only leaf",
					pol, got, ok, n-1)
			}
		})
	}
}
