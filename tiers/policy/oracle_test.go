package policy

import (
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

// TestReuseOracleRefusesDeadBlocks: on a tiny workload the oracle admits
// exactly the blocks that are referenced again, and evicts a resident block
// once its last reference has passed, ahead of any live block.
func TestReuseOracleRefusesDeadBlocks(t *testing.T) {
	reqs := []trace.Request{
		{HashIDs: []int64{1, 2}},    // 1, 2 reused below; 3 never
		{HashIDs: []int64{1, 2, 3}}, // 1 reused once more; 2 dies here
		{HashIDs: []int64{9}},       // cold, never reused: refused
		{HashIDs: []int64{1}},
	}
	w := Compile(reqs)
	r := w.Simulate(2, NewReuseOracle(w))
	if r.Hits != 3 { // 1,2 in request 2; 1 in request 4
		t.Errorf("hits %d, want 3", r.Hits)
	}
	if r.Inserts != 2 || r.Rejects != 2 {
		t.Errorf("inserts %d rejects %d, want 2 and 2 (only blocks 1 and 2 are ever reused)", r.Inserts, r.Rejects)
	}
	if b := w.Simulate(2, NewBelady(w, 2)).Hits; r.Hits > b {
		t.Errorf("oracle %d hits above Belady's %d", r.Hits, b)
	}
}

// TestReuseOracleBound measures on the development trace how much of the
// LRU→Belady gap a perfect predictor of "will this block be referenced
// again" closes, the bound that docs/policy.md quotes.
func TestReuseOracleBound(t *testing.T) {
	w, bounds := devBounds(t)
	for _, b := range bounds {
		n, lru, bel := b.n, b.lru, b.bel
		or := w.Simulate(n, NewReuseOracle(w)).HitRatio()
		chain := w.Simulate(n, NewChain(n)).HitRatio()
		t.Logf("N=%d: LRU %.4f, reuse oracle %.4f (%.1f%% of the gap), Belady %.4f", n, lru, or, 100*gapFrac(or, lru, bel), bel)
		if or < chain || or > bel {
			t.Errorf("N=%d: reuse oracle %.4f outside [chain %.4f, Belady %.4f]", n, or, chain, bel)
		}
	}
}

// TestPredictorQualityNeeded feeds Density a dead/live class that is right
// with probability q (q = 1: the truth) instead of its own classes, to
// measure how accurate a reuse predictor must be to close a given share of
// the gap (docs/policy.md). Diagnostic: run with -sweep.
func TestPredictorQualityNeeded(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to measure")
	}
	w, bounds := devBounds(t)
	for _, b := range bounds {
		n, lru, bel := b.n, b.lru, b.bel
		own := w.Simulate(n, NewDensity(n)).HitRatio()
		t.Logf("N=%d: density with its own classes %.4f (%.1f%% of the gap)", n, own, 100*gapFrac(own, lru, bel))
		for _, q := range []float64{0.7, 0.8, 0.85, 0.9, 0.95, 1} {
			p := NewDensity(n)
			p.shrink = 0 // the injected classes are not groups of the default's
			cur := 0
			r := rand.New(rand.NewPCG(1, 2))
			p.reclass = func(uint16) uint16 {
				dead := w.next[cur] == noNext
				cur++
				if r.Float64() >= q {
					dead = !dead
				}
				if dead {
					return 0
				}
				return 1
			}
			got := w.Simulate(n, p).HitRatio()
			t.Logf("N=%d: predictor right with p=%.2f: %.4f (%.1f%% of the gap)", n, q, got, 100*gapFrac(got, lru, bel))
		}
	}
}
