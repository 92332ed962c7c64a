package policy

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

// duel is an experiment (docs/policy.md, "Two-shadow duel at every quarter
// octave"): set dueling
// between density and recency with two keys-only shadow caches of the real
// cache's capacity, a Density and a Chain, each fed the same reference
// stream and never influenced by the real cache. Each shadow counts its
// own prefix hits; blocks where exactly one shadow hits score for it
// (decayed by decay per capacity references). The real cache is a Density
// that evicts by its own rule, or by recency (orphans first, then the exact
// least recently used leaf, as during its warm-up) while the chain shadow
// leads by more than z standard errors (√(D+C) for the decayed counts D
// and C: the spread of their difference if each disagreement were a coin
// flip). The mode changes only when the other side leads by that margin
// (hysteresis). perWindow decides at the end of every capacity references
// instead of at every eviction.
type duel struct {
	real      *Density
	sd        *shadow
	sc        *shadow
	z         float64
	decay     float64
	perWindow bool
	// reqSE measures the standard error per request instead of per block:
	// a request's blocks hit or miss together (whole chains), so the
	// spread of D−C is √Σ δ² over requests, δ the request's difference.
	reqSE bool

	d, c    float64 // decayed scores: density's shadow, chain's shadow
	v       float64 // reqSE: decayed Σ δ² over finished requests
	delta   float64 // reqSE: the current request's D−C so far
	clock   uint64
	next    uint64
	switchs int
}

// shadow is a keys-only cache driven by one policy.
type shadow struct {
	p      Policy
	has    func(Key) bool
	in     bool // still in the current request's prefix of hits
	hits   int
	refs   int
	limitf func() int
}

func (s *shadow) ref(k Key, a AccessInfo) bool {
	if a.Pos == 0 {
		s.in = true
	}
	s.refs++
	if s.has(k) {
		s.p.Access(k, a)
		if s.in {
			s.hits++
			return true
		}
		return false
	}
	s.in = false
	if !s.p.Admit(k, a) {
		return false
	}
	s.p.Insert(k, a)
	for s.p.Len() > s.limitf() {
		v, ok := s.p.Victim()
		if !ok {
			break
		}
		s.p.Remove(v)
	}
	return false
}

func newDuel(capacity int, z, decay float64, perWindow bool) *duel {
	d := &duel{real: NewDensity(capacity), z: z, decay: decay, perWindow: perWindow}
	limit := func() int { return d.real.capacity }
	sd := NewDensity(capacity)
	sc := NewChain(capacity)
	d.sd = &shadow{p: sd, has: func(k Key) bool { return sd.m[k] != nil }, limitf: limit}
	d.sc = &shadow{p: sc, has: func(k Key) bool { return sc.m[k] != nil }, limitf: limit}
	d.next = uint64(max(capacity, 1))
	return d
}

// follow makes the real cache evict first the leaves that the leading
// shadow does not hold.
func (d *duel) follow() *duel {
	sd, sc := d.sd.p.(*Density), d.sc.p.(*Chain)
	d.real.held = func(k Key) bool {
		if d.real.recency {
			return sc.m[k] != nil
		}
		return sd.m[k] != nil
	}
	return d
}

func (d *duel) step(k Key, a AccessInfo) {
	if a.Pos == 0 {
		d.v += d.delta * d.delta
		d.delta = 0
	}
	hd := d.sd.ref(k, a)
	hc := d.sc.ref(k, a)
	switch {
	case hd && !hc:
		d.d++
		d.delta++
	case hc && !hd:
		d.c++
		d.delta--
	}
	d.clock++
	if d.clock >= d.next {
		d.d *= d.decay
		d.c *= d.decay
		d.v *= d.decay * d.decay
		d.next = d.clock + uint64(d.real.capacity)
		if d.perWindow {
			d.decide()
		}
	}
}

func (d *duel) decide() {
	m := d.z * math.Sqrt(d.d+d.c)
	if d.reqSE {
		m = d.z * math.Sqrt(d.v)
	}
	was := d.real.recency
	if d.real.recency {
		if d.d-d.c > m {
			d.real.recency = false
		}
	} else if d.c-d.d > m {
		d.real.recency = true
	}
	if was != d.real.recency {
		d.switchs++
	}
}

func (d *duel) Access(k Key, a AccessInfo)     { d.step(k, a); d.real.Access(k, a) }
func (d *duel) Admit(k Key, a AccessInfo) bool { d.step(k, a); return d.real.Admit(k, a) }
func (d *duel) Insert(k Key, a AccessInfo)     { d.real.Insert(k, a) }
func (d *duel) Remove(k Key)                   { d.real.Remove(k) }
func (d *duel) Pin(k Key)                      { d.real.Pin(k) }
func (d *duel) Unpin(k Key)                    { d.real.Unpin(k) }
func (d *duel) Len() int                       { return d.real.Len() }
func (d *duel) Name() string                   { return "duel" }
func (d *duel) Victim() (Key, bool) {
	if !d.perWindow {
		d.decide()
	}
	return d.real.Victim()
}

var duelVariants = map[string]func(n int) Policy{
	"density": func(n int) Policy { return NewDensity(n) },
	"chain":   func(n int) Policy { return NewChain(n) },
	"E0":      func(n int) Policy { return newDuel(n, 0, dDecay, false) },
	"E2":      func(n int) Policy { return newDuel(n, 2, dDecay, false) },
	"W0":      func(n int) Policy { return newDuel(n, 0, dDecay, true) },
	"W2":      func(n int) Policy { return newDuel(n, 2, dDecay, true) },
	"E1r":     func(n int) Policy { d := newDuel(n, 1, dDecay, false); d.reqSE = true; return d },
	"E2r":     func(n int) Policy { d := newDuel(n, 2, dDecay, false); d.reqSE = true; return d },
	"W2r":     func(n int) Policy { d := newDuel(n, 2, dDecay, true); d.reqSE = true; return d },
	// follow the leader's content: leaves the leading shadow does not hold go first
	"F0":   func(n int) Policy { return newDuel(n, 0, dDecay, false).follow() },
	"F2r":  func(n int) Policy { d := newDuel(n, 2, dDecay, false); d.reqSE = true; return d.follow() },
	"FW2r": func(n int) Policy { d := newDuel(n, 2, dDecay, true); d.reqSE = true; return d.follow() },
	// a recent window of about two turnovers instead of twenty
	"E0s": func(n int) Policy { return newDuel(n, 0, 0.5, false) },
	"E2s": func(n int) Policy { return newDuel(n, 2, 0.5, false) },
	"W2s": func(n int) Policy { return newDuel(n, 2, 0.5, true) },
}

// TestDuel measures the duel variants against LRU (skipped without -sweep):
//
//	DUEL=E0,E2,W0,W2 DUELSET=dev go test ./tiers/policy -run TestDuel -sweep -v
//
// DUELSET: dev (the development trace and its halves at 33 quarter-octave
// sizes from 250 to 64,000 blocks), five (the development trace at 1k–20k),
// gen (the generators, seeds 1 and 2, five sizes each). Cells run in
// parallel (GOMAXPROCS).
func TestDuel(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to measure the duel")
	}
	names := strings.Split(os.Getenv("DUEL"), ",")
	var cases []workloadCase
	switch set := os.Getenv("DUELSET"); set {
	case "dev", "five":
		reqs := devTrace(t)
		a, b := trace.Split(reqs)
		sz := quarterOctaves(64000)
		if set == "five" {
			cases = []workloadCase{{"dev", Compile(reqs), devSizes}}
			break
		}
		cases = []workloadCase{{"dev", Compile(reqs), sz}, {"h1", Compile(a), sz}, {"h2", Compile(b), sz}}
	case "gen":
		cases = synthetic()
	default:
		t.Fatalf("DUELSET=%q", set)
	}
	type cell struct {
		c       int
		n       int
		lru     float64
		bel     float64
		got     []float64
		switchs []int
	}
	var cells []*cell
	for ci, c := range cases {
		for _, n := range c.sizes {
			cells = append(cells, &cell{c: ci, n: n, got: make([]float64, len(names)), switchs: make([]int, len(names))})
		}
	}
	work := make(chan func())
	var wg sync.WaitGroup
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				f()
			}
		}()
	}
	for _, cl := range cells {
		w := cases[cl.c].w
		work <- func() { cl.lru = w.Simulate(cl.n, NewLRU()).HitRatio() }
		work <- func() { cl.bel = w.Simulate(cl.n, NewBelady(w, cl.n)).HitRatio() }
		for i, name := range names {
			mk := duelVariants[name]
			if mk == nil {
				t.Fatalf("unknown variant %q", name)
			}
			work <- func() {
				p := mk(cl.n)
				cl.got[i] = w.Simulate(cl.n, p).HitRatio()
				if d, ok := p.(*duel); ok {
					cl.switchs[i] = d.switchs
				}
			}
		}
	}
	close(work)
	wg.Wait()
	for ci, c := range cases {
		below := make([]int, len(names))
		worst := make([]float64, len(names))
		sum := make([]float64, len(names))
		for _, cl := range cells {
			if cl.c != ci {
				continue
			}
			line := fmt.Sprintf("%-10s N=%-6d lru %.4f bel %.4f", c.name, cl.n, cl.lru, cl.bel)
			for i, name := range names {
				g := gapFrac(cl.got[i], cl.lru, cl.bel)
				if !math.IsNaN(g) {
					sum[i] += g
				}
				mark := ""
				if cl.got[i] < cl.lru {
					below[i]++
					worst[i] = min(worst[i], cl.got[i]-cl.lru)
					mark = fmt.Sprintf(" !%+.4f", cl.got[i]-cl.lru)
				}
				line += fmt.Sprintf("  %s %.4f (%+.1f%%) sw%d%s", name, cl.got[i], 100*g, cl.switchs[i], mark)
			}
			fmt.Println(line)
		}
		k := len(c.sizes)
		for i, name := range names {
			fmt.Printf("SUMMARY %s %s: %d sizes, mean gap closed %+.1f%%, below LRU in %d, worst %+.4f\n",
				c.name, name, k, 100*sum[i]/float64(k), below[i], worst[i])
		}
	}
}

// TestDuelDiag prints, for the second half's worst cells, each shadow's own
// prefix hit ratio, the real cache's, the number of mode switches and the
// share of evictions taken in recency mode (skipped without -sweep):
//
//	go test ./tiers/policy -run TestDuelDiag -sweep -v
func TestDuelDiag(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to run the duel diagnostics")
	}
	_, b := trace.Split(devTrace(t))
	w := Compile(b)
	for _, n := range []int{2378, 2828, 4757, 6727} {
		for _, v := range []struct {
			name      string
			z         float64
			perWindow bool
		}{{"E0", 0, false}, {"E2", 2, false}, {"W2", 2, true}} {
			d := newDuel(n, v.z, dDecay, v.perWindow)
			c := &countVictims{duel: d}
			got := w.Simulate(n, c).HitRatio()
			fmt.Printf("h2 N=%d %s: real %.4f, density shadow %.4f, chain shadow %.4f, switches %d, recency evictions %d of %d (warm-up %d)\n",
				n, v.name, got, float64(d.sd.hits)/float64(d.sd.refs), float64(d.sc.hits)/float64(d.sc.refs),
				d.switchs, c.recency, c.all, min(c.all, n))
		}
	}
}

type countVictims struct {
	*duel
	all, recency int
}

func (c *countVictims) Victim() (Key, bool) {
	k, ok := c.duel.Victim()
	c.all++
	if c.duel.real.recency {
		c.recency++
	}
	return k, ok
}

// BenchmarkDuelOps is BenchmarkOps for the duel variants (density for
// reference): go test ./tiers/policy -run '^$' -bench DuelOps -benchtime=200000x
func BenchmarkDuelOps(b *testing.B) {
	const capacity = 100000
	for _, name := range []string{"density", "E0", "W2r", "F2r"} {
		b.Run(name, func(b *testing.B) {
			p := duelVariants[name](capacity)
			n, id := 0, 0
			step := func(i int) {
				pos := i % 32
				a := AccessInfo{Pos: pos, ChainLen: 32, Request: uint64(i / 32)}
				key := k(id)
				if pos > 0 {
					a.HasParent, a.Parent = true, k(id-1)
				}
				if p.Admit(key, a) {
					p.Insert(key, a)
					n++
					for n > capacity {
						v, _ := p.Victim()
						p.Remove(v)
						n--
					}
				}
				p.Access(k(id/2), a)
				id++
			}
			for i := range 2 * capacity {
				step(i)
			}
			b.ResetTimer()
			for i := range b.N {
				step(2*capacity + i)
			}
		})
	}
}
