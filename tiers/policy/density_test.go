package policy

import (
	"math"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

// TestDensityShrink checks the empirical-Bayes pooling of Density's
// per-class hazards: a class with no data follows its group, a class with
// many references keeps its own estimate, a class with a single event is
// pulled towards its group, and groups do not leak into each other.
func TestDensityShrink(t *testing.T) {
	const (
		big    = 0           // group 0: many references
		empty  = 1           // group 0: no data
		lone   = 2           // group 0: one reuse at a young age
		reused = 2*dLenB + 0 // group 2: no data
		young  = 2           // age bin of lone's reuse
		mid    = 10          // age bin of big's reuses
		far    = 20          // age bin where big's other references were censored
	)
	build := func(shrink float64) *Density {
		p := NewDensity(100)
		p.shrink = shrink
		p.st[big].hits[mid] = 1000
		p.st[big].cens[far] = 1000
		p.st[lone].hits[young] = 1
		p.reconfigure()
		return p
	}
	on, off := build(dShrink), build(0)
	if classGroup(big) != classGroup(lone) || classGroup(big) == classGroup(reused) {
		t.Fatalf("test classes in the wrong groups")
	}
	for _, tt := range []struct {
		name string
		cls  int
		want func(p *Density, age int) float64
		tol  float64
	}{
		{"big keeps its own estimate", big, func(p *Density, b int) float64 { return off.dens[big][b] }, 0.02},
		{"empty follows its group", empty, func(p *Density, b int) float64 { return p.dens[big][b] }, 0.02},
	} {
		for b := 0; b <= mid; b++ {
			got, want := on.dens[tt.cls][b], tt.want(on, b)
			if want == 0 || math.Abs(got-want)/want > tt.tol {
				t.Errorf("%s: bin %d density %.3g, want %.3g ± %.0f%%", tt.name, b, got, want, 100*tt.tol)
			}
		}
	}
	// Without pooling a single young reuse makes the class look far denser
	// than its group; pooled, it weighs one reference against dShrink.
	for b := 0; b <= young; b++ {
		raw, pooled := off.dens[lone][b]/off.dens[big][b], on.dens[lone][b]/on.dens[big][b]
		t.Logf("bin %d: lone/group density %.1f unpooled, %.1f pooled", b, raw, pooled)
		if raw < 20 || pooled > raw/5 || pooled < 1 {
			t.Errorf("bin %d: lone/group density %.1f unpooled, %.1f pooled; want ≥ 20 and within [1, %.1f]", b, raw, pooled, raw/5)
		}
	}
	if off.dens[empty][0] != 0 {
		t.Errorf("unpooled empty class density %.3g, want 0", off.dens[empty][0])
	}
	for b := range dBins {
		if on.dens[reused][b] != 0 {
			t.Fatalf("reused class got density %.3g at bin %d from another group", on.dens[reused][b], b)
		}
	}
}

// victimLog records the victims a policy names.
type victimLog struct {
	Policy
	v []Key
}

func (l *victimLog) Victim() (Key, bool) {
	k, ok := l.Policy.Victim()
	if ok {
		l.v = append(l.v, k)
	}
	return k, ok
}

// TestDensityWarmUp checks that Density evicts as chain does (the least
// recently used leaf) for its first capacity evictions, while its tables
// are young, and by its tables afterwards.
func TestDensityWarmUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		reqs []trace.Request
		frac float64
	}{
		{"docs", trace.Docs(1, 1500), 0.05},
		{"chat", trace.Chat(2, 1500), 0.1},
		{"mixed", trace.Mixed(3, 1500), 0.2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := Compile(tc.reqs)
			n := int(tc.frac * float64(w.Blocks()))
			d, c := &victimLog{Policy: NewDensity(n)}, &victimLog{Policy: NewChain(n)}
			w.Simulate(n, d)
			w.Simulate(n, c)
			if len(d.v) < 2*n {
				t.Fatalf("%d evictions at capacity %d: the trace is too short to test the warm-up", len(d.v), n)
			}
			same := 0
			for same < min(len(d.v), len(c.v)) && d.v[same] == c.v[same] {
				same++
			}
			if same < n {
				t.Errorf("eviction %d of the first %d differs from chain's", same, n)
			}
			if same == len(d.v) {
				t.Errorf("all %d evictions equal chain's: the tables never decided", len(d.v))
			}
			cold := &victimLog{Policy: func() Policy { p := NewDensity(n); p.noWarm = true; return p }()}
			w.Simulate(n, cold)
			early := 0
			for early < min(len(cold.v), len(c.v)) && cold.v[early] == c.v[early] {
				early++
			}
			if early >= n {
				t.Errorf("without the warm-up the first %d evictions still equal chain's: the case does not test it", early)
			}
		})
	}
}
