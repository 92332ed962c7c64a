package tiers

import (
	"testing"
	"time"
)

// TestParkDuringDelete: a Delete (a release) or DeleteNS clears the parked
// set first, then deletes from the host tier, then from NVMe. A block of
// the same key (or namespace) committed and parked after the host step is
// written through to NVMe and leaves the host tier; the NVMe step then
// deletes it. No tier stores it any more, so the parked set must not hold
// it: it would count as parked until its TTL (kvtier_parked_blocks), and
// the request would look parked.
func TestParkDuringDelete(t *testing.T) {
	const bs = 64 << 10
	const ns = 4 | ParkedNS
	for _, tt := range []struct {
		name string
		del  func(c *Chain, k Key)
	}{
		{"Delete", func(c *Chain, k Key) { c.Delete(k) }},
		{"DeleteNS", func(c *Chain, k Key) { c.DeleteNS(k.NS) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20,
				cfg: ChainConfig{ParkTTL: time.Hour}, noStart: true})
			k := chainKey(ns, 1)
			raced := false
			r.c.deleteHook = func(Key) { // after the host step, before the NVMe step
				if raced {
					return
				}
				raced = true
				hd, err := r.c.Reserve(k, bs)
				if err != nil {
					t.Errorf("reserve %v: %v", k, err)
					return
				}
				fillFor(r.h.Bytes(hd), k)
				if err := r.h.Commit(hd); err != nil {
					t.Errorf("commit %v: %v", k, err)
					return
				}
				r.c.Park(k)
				eventually(t, 10*time.Second, "the parked block written through", func() bool {
					return r.store.Contains(nk(k)) && !r.h.Contains(k)
				})
			}
			r.start()
			tt.del(r.c, k)
			if !raced {
				t.Fatal("the delete hook did not run")
			}
			stored := r.inAny(k)
			if parked := r.c.isParked(k); parked != stored {
				t.Errorf("after the delete: parked %v, stored %v (host %v, nvme %v); want the parked set to hold exactly the parked blocks stored",
					parked, stored, r.h.Contains(k), r.store.Contains(nk(k)))
			}
			if n := r.c.Stats().ParkedBlocks; stored && n != 1 || !stored && n != 0 {
				t.Errorf("parked blocks %d, stored %v", n, stored)
			}
		})
	}
}
