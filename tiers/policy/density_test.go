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

// genCase is a generator trace and a cache size as a fraction of its
// distinct blocks.
type genCase struct {
	name string
	reqs []trace.Request
	frac float64
}

// sized compiles the trace and returns it with the cache size in blocks.
func (c genCase) sized() (*Workload, int) {
	w := Compile(c.reqs)
	return w, int(c.frac * float64(w.Blocks()))
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
	for _, tc := range []genCase{
		{"docs", trace.Docs(1, 1500), 0.05},
		{"chat", trace.Chat(2, 1500), 0.1},
		{"mixed", trace.Mixed(3, 1500), 0.2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, n := tc.sized()
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

// TestDensityCalibrate checks that Density sizes itself to the blocks
// resident at its first Victim when NewDensity's capacity is only a hint
// (the daemon's is host bytes / 1 MiB), and while the tier fills at least
// doubles it as soon as more blocks than that are resident: every
// size-dependent parameter follows, a demotion pass between watermarks does
// not move it, and the
// hit ratio with a hint 64 times too large or too small is within 0.005 of
// the one with the true size, where without calibration a hint 8 times too
// large loses far more (the warm-up and forgetting are 8 turnovers long).
func TestDensityCalibrate(t *testing.T) {
	t.Run("parameters", func(t *testing.T) {
		p := NewDensity(8000)
		for i := range 1000 {
			k := KeyOf(int64(i))
			a := AccessInfo{Request: uint64(i)}
			if !p.Admit(k, a) {
				t.Fatalf("head block %d refused", i)
			}
			p.Insert(k, a)
		}
		for _, tt := range []struct {
			resident, want int
		}{
			{1000, 1000}, // the hint was 8×: calibrate
			{900, 1000},  // a demotion pass towards the low watermark: keep
			{1200, 1000}, // within a quarter: keep
			{1300, 1300}, // grown by more than a quarter: followed at the next victim
		} {
			for len(p.m) > tt.resident {
				k, ok := p.Victim()
				if !ok {
					t.Fatal("no victim")
				}
				p.Remove(k)
			}
			for i := int64(1 << 20); len(p.m) < tt.resident; i++ {
				p.Insert(KeyOf(i), AccessInfo{})
			}
			p.Victim()
			if p.capacity != tt.want || p.tr.limit != dHistory*tt.want || p.period != uint64(tt.want) || len(p.ref.pairs) != tt.want {
				t.Errorf("%d resident: capacity %d, history %d, period %d, referee slots %d; want %d, %d, %d, %d",
					tt.resident, p.capacity, p.tr.limit, p.period, len(p.ref.pairs), tt.want, dHistory*tt.want, tt.want, tt.want)
			}
			if len(p.tr.m) > p.tr.limit {
				t.Errorf("%d resident: history holds %d entries over its limit %d", tt.resident, len(p.tr.m), p.tr.limit)
			}
		}
	})
	t.Run("filling", func(t *testing.T) {
		p := NewDensity(100)
		for i := range 1000 {
			p.Insert(KeyOf(int64(i)), AccessInfo{})
		}
		if p.capacity < 1000 || p.capacity > 2000 {
			t.Errorf("1000 resident past a hint of 100, no victim yet: capacity %d, want 1000–2000", p.capacity)
		}
		p.Victim()
		if p.capacity != 1000 {
			t.Errorf("at the first victim with 1000 resident: capacity %d, want 1000", p.capacity)
		}
	})
	for _, tc := range []genCase{
		{"docs", trace.Docs(1, 4000), 0.1},
		{"mixed", trace.Mixed(1, 4000), 0.05},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, n := tc.sized()
			exact := w.Simulate(n, NewDensity(n)).HitRatio()
			lru := w.Simulate(n, NewLRU()).HitRatio()
			for _, hint := range []int{n / 64, n / 8, 8 * n, 64 * n} {
				got := w.Simulate(n, NewDensity(hint)).HitRatio()
				t.Logf("N=%d hint %d: %.4f (true size %.4f, LRU %.4f)", n, hint, got, exact, lru)
				if math.Abs(got-exact) > 0.005 {
					t.Errorf("N=%d hint %d: hit ratio %.4f, with the true size %.4f", n, hint, got, exact)
				}
			}
			p := NewDensity(8 * n)
			p.noCalibrate = true
			got := w.Simulate(n, p).HitRatio()
			t.Logf("N=%d hint %d, not calibrated: %.4f", n, 8*n, got)
			if exact-got < 0.01 {
				t.Errorf("N=%d: without calibration a hint of 8× loses only %.4f: the case does not test it", n, exact-got)
			}
		})
	}
}
