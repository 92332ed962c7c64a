package tiers

import (
	"testing"
)

// applyPolicyEvents applies the queued policy events, as policyLoop does
// (for a chain that was not started).
func applyPolicyEvents(c *Chain) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	for {
		select {
		case ev := <-c.polCh:
			c.apply(ev)
		default:
			return
		}
	}
}

// TestPolicyForgetsVictimDeletedDuringFailedWrite: a demotion victim
// deleted while its write to NVMe failed is gone from the host tier; the
// mover must not hand it back to the replacement policy, which would then
// track a block the tier does not hold (policy.Len above the resident
// blocks, until a demotion pass happens to pick it).
func TestPolicyForgetsVictimDeletedDuringFailedWrite(t *testing.T) {
	const bs = 64 << 10
	k := chainKey(51, 1)
	var r *chainRig
	r = newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{Policy: "lru"},
		hook: func(op string, x Key) {
			if op == "put" && x == k {
				r.c.Delete(x)       // the client deletes it mid-write
				_ = r.store.Close() // and the write fails
			}
		}})
	r.putHost(t, k, bs)
	applyPolicyEvents(r.c)
	if n := r.c.pol.Len(); n != 1 {
		t.Fatalf("policy tracks %d blocks after one put, want 1", n)
	}
	r.c.demoteMu.Lock()
	moved := r.c.demoteBatch(1)
	r.c.demoteMu.Unlock()
	applyPolicyEvents(r.c)
	blocks := r.h.Stats().Blocks
	if n := r.c.pol.Len(); n != blocks || r.h.Contains(k) {
		t.Fatalf("after the failed demotion of a deleted block (moved %d): policy tracks %d blocks, host tier holds %d", moved, n, blocks)
	}
}
