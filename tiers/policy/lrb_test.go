package policy

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

// hotCold is a stream of one-block requests: a cycle of hot blocks, each
// followed by several one-off cold blocks, so that a hot block returns
// after more references than the cache holds. LRU never hits; a policy that
// learns "referenced before, middle-aged → back soon" keeps the hot cycle.
func hotCold(hot, cold, rounds int) []trace.Request {
	var reqs []trace.Request
	id := int64(1 << 20)
	for r := range rounds {
		reqs = append(reqs, trace.Request{Timestamp: int64(len(reqs)), HashIDs: []int64{int64(r % hot)}})
		for range cold {
			reqs = append(reqs, trace.Request{Timestamp: int64(len(reqs)), HashIDs: []int64{id}})
			id++
		}
	}
	return reqs
}

func TestLRBLearnsHotCycle(t *testing.T) {
	w := Compile(hotCold(20, 5, 1500))
	const n = 100 // a hot block returns every 120 references
	lru := w.Simulate(n, NewLRU()).HitRatio()
	p := NewLRB(n)
	got := w.Simulate(n, p).HitRatio()
	bel := w.Simulate(n, NewBelady(w, n)).HitRatio()
	t.Logf("LRU %.3f, lrb %.3f (%d fits), Belady %.3f", lru, got, p.ver, bel)
	if p.ver == 0 {
		t.Fatal("no model was trained")
	}
	if got < lru+0.5*(bel-lru) {
		t.Errorf("lrb %.3f closes less than half of the LRU %.3f → Belady %.3f gap", got, lru, bel)
	}
}

// TestLRBBeforeModelIsLeafLRU: without a model the victim is the least
// recently referenced leaf; orphans go first.
func TestLRBBeforeModelIsLeafLRU(t *testing.T) {
	p := NewLRB(8)
	for i := range 3 { // chain 0-1-2: only 2 is a leaf
		p.Insert(k(i), chainInfo(i, 0))
		p.Access(k(i), chainInfo(i, 0))
	}
	p.Insert(k(5000), AccessInfo{Request: 5}) // a head, referenced later
	p.Access(k(5000), AccessInfo{Request: 5})
	if v, _ := p.Victim(); v != k(2) {
		t.Fatalf("victim %v, want the older leaf %v", v, k(2))
	}
	orphan := AccessInfo{Pos: 1, HasParent: true, Parent: k(-7), Request: 6}
	p.Insert(k(6001), orphan)
	if v, _ := p.Victim(); v != k(6001) {
		t.Fatalf("victim %v, want the orphan", v)
	}
	if p.Admit(k(6002), orphan) {
		t.Fatal("admitted an orphan")
	}
}

func TestLRBDeterministic(t *testing.T) {
	w := Compile(trace.Mixed(3, 150))
	p := NewLRB(300)
	a := w.Simulate(300, p)
	b := w.Simulate(300, NewLRB(300))
	if a != b {
		t.Fatalf("two runs differ: %v / %v", a, b)
	}
	if p.ver == 0 {
		t.Fatal("no model was trained: the test does not cover the learned path")
	}
}

// TestLRBSensitivity prints the sensitivity of lrb to its structural
// constants on the development trace, mean and spread over three sampling
// seeds (docs/policy.md):
//
//	go test ./tiers/policy -run LRBSensitivity -sweep -v
func TestLRBSensitivity(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to measure")
	}
	w, bounds := devBounds(t)
	for _, b := range bounds {
		n, lru, bel := b.n, b.lru, b.bel
		for _, c := range []struct {
			train, horiz int
			every        float64 // refit interval, in cache turnovers
		}{{1, lHorizons, 1}, {lTrain, lHorizons, 1}, {16, lHorizons, 1}, {lTrain, 6, 1}, {lTrain, 20, 1}, {lTrain, lHorizons, 0.25}, {lTrain, lHorizons, 4}} {
			var gs []float64
			for seed := range uint64(3) {
				p := NewLRB(n)
				p.rng = rand.New(rand.NewPCG(5+seed, 6))
				p.trN = max(c.train*n, 1024)
				p.horiz = c.horiz
				p.every = max(int(c.every*float64(n)), 256)
				gs = append(gs, 100*gapFrac(w.Simulate(n, p).HitRatio(), lru, bel))
			}
			slices.Sort(gs)
			t.Logf("N=%d training set %dC, %d horizons, refit every %gC: %+.1f%% of the gap (seeds: %+.1f … %+.1f)", n, c.train, c.horiz, c.every, (gs[0]+gs[1]+gs[2])/3, gs[0], gs[2])
		}
	}
}

// featProbe records, at every reference, lrb's features of the referenced
// block and whether (and after how many references) it is referenced again.
type featProbe struct {
	*LRB
	w   *Workload
	cur int
	x   [][lFeat]uint8
	gap []int32 // references to the next one; noNext if none
}

func (f *featProbe) rec(k Key) {
	var x [lFeat]uint8
	f.features(f.hist[k], &x)
	f.x = append(f.x, x)
	g := noNext
	if nx := f.w.next[f.cur]; nx != noNext {
		g = nx - int32(f.cur)
	}
	f.gap = append(f.gap, g)
	f.cur++
}

func (f *featProbe) Access(k Key, a AccessInfo) { f.LRB.Access(k, a); f.rec(k) }
func (f *featProbe) Admit(k Key, a AccessInfo) bool {
	ok := f.LRB.Admit(k, a)
	f.rec(k)
	return ok
}

// TestLRBPredictability measures how well the tree ensemble predicts, from
// lrb's features at reference time, whether a block is referenced again
// (ever, or within 1 or 4 cache turnovers): trained on one half of the
// references and tested on the other, split at random (an optimistic bound:
// same period) or in time (first half → second half, the online setting).
//
//	go test ./tiers/policy -run LRBPredictability -sweep -v
func TestLRBPredictability(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to measure")
	}
	w := Compile(devTrace(t))
	for _, n := range []int{2000, 10000} {
		f := &featProbe{LRB: NewLRB(n), w: w}
		w.Simulate(n, f)
		var sc gbmScratch
		for _, split := range []string{"random", "time"} {
			test := func(i int) bool { return i >= len(f.x)/2 }
			if split == "random" {
				test = func(i int) bool { return (uint32(i)*2654435761)>>16&1 == 1 }
			}
			for _, h := range []float64{0, 1, 4} {
				y := make([]float32, len(f.x))
				for i, g := range f.gap {
					if g != noNext && (h == 0 || float64(g) <= h*float64(n)) {
						y[i] = 1
					}
				}
				var tx [][lFeat]uint8
				var ty []float32
				for i := range f.x {
					if !test(i) {
						tx, ty = append(tx, f.x[i]), append(ty, y[i])
					}
				}
				g := fitGBM(tx, ty, gbmDefault, &sc)
				right, live, m := 0, 0, 0
				for i := range f.x {
					if !test(i) {
						continue
					}
					m++
					if (g.predict(&f.x[i]) >= 0.5) == (y[i] == 1) {
						right++
					}
					if y[i] == 1 {
						live++
					}
				}
				what := "ever"
				if h > 0 {
					what = "within " + strconv.FormatFloat(h, 'g', -1, 64) + "C"
				}
				t.Logf("N=%d %s split, reused %s: accuracy %.1f%%, majority label %.1f%%", n, split, what, 100*float64(right)/float64(m), 100*float64(max(live, m-live))/float64(m))
			}
		}
	}
}

// TestLRBHindsightBound bounds what any learner using lrb's features could
// give Density: a tree ensemble is fitted with hindsight on the whole
// trace (label: the block is referenced again) and its prediction at each
// reference replaces Density's class — as a dead/live label, or in ten
// probability buckets.
//
//	go test ./tiers/policy -run LRBHindsightBound -sweep -v
func TestLRBHindsightBound(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to measure")
	}
	w, bounds := devBounds(t)
	for _, b := range bounds {
		n, lru, bel := b.n, b.lru, b.bel
		f := &featProbe{LRB: NewLRB(n), w: w}
		w.Simulate(n, f)
		y := make([]float32, len(f.x))
		for i, g := range f.gap {
			if g != noNext {
				y[i] = 1
			}
		}
		var sc gbmScratch
		g := fitGBM(f.x, y, gbmDefault, &sc)
		pr := make([]float32, len(f.x))
		right := 0
		for i := range f.x {
			pr[i] = g.predict(&f.x[i])
			if (pr[i] >= 0.5) == (y[i] == 1) {
				right++
			}
		}
		for _, buckets := range []int{2, 10} {
			p := NewDensity(n)
			p.shrink = 0 // the injected classes are not groups of the default's
			cur := 0
			p.reclass = func(uint16) uint16 {
				q := min(max(pr[cur], 0), 0.999)
				cur++
				if buckets == 2 {
					if q >= 0.5 {
						return 1
					}
					return 0
				}
				return uint16(q * float32(buckets))
			}
			got := w.Simulate(n, p).HitRatio()
			t.Logf("N=%d: density with hindsight-fitted ensemble classes (%d buckets; in-sample accuracy %.1f%%): %.4f (%+.1f%% of the gap)", n, buckets, 100*float64(right)/float64(len(f.x)), got, 100*gapFrac(got, lru, bel))
		}
	}
}
