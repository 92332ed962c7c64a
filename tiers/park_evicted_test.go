package tiers

import "testing"

// TestParkOfEvictedBlock: the daemon commits a parked block and then calls
// Park; a reservation of another session may evict the block in between
// (its removal finds it not parked yet). Park must not then record a
// parked block that no tier stores: kvtier_parked_blocks would count it
// until its TTL, and the request would look parked.
func TestParkOfEvictedBlock(t *testing.T) {
	const bs = 1 << 20
	for _, tt := range []struct {
		name string
		nvme bool
	}{{"nvme", true}, {"host only", false}} {
		t.Run(tt.name, func(t *testing.T) {
			var c *Chain
			var h *Host
			if tt.nvme {
				r := newChainRig(t, rigOpts{hostBytes: 1 << 20, slabBytes: 1 << 20, noStart: true})
				c, h = r.c, r.h
			} else {
				var err error
				if h, err = NewHost(make([]byte, 1<<20), HostConfig{SlabBytes: 1 << 20}); err != nil {
					t.Fatal(err)
				}
				if c, err = NewChain(h, nil, ChainConfig{Logger: discardLogger()}); err != nil {
					t.Fatal(err)
				}
			}
			k := Key{NS: 5 | ParkedNS, Hash: chainKey(5, 1).Hash}
			hd, err := c.Reserve(k, bs)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Commit(hd); err != nil {
				t.Fatal(err)
			}
			other, err := c.Reserve(chainKey(6, 1), bs) // evicts k: the tier holds one block
			if err != nil {
				t.Fatal(err)
			}
			defer h.Abort(other)
			if h.Contains(k) {
				t.Fatal("the parked block was not evicted")
			}
			c.Park(k)
			if n := c.ParkedBlocks(); n != 0 {
				t.Fatalf("parked blocks %d after parking a block no tier holds, want 0", n)
			}
		})
	}
}
