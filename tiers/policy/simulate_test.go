package policy

import (
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

var (
	sweep     = flag.Bool("sweep", false, "print the policy comparison tables (docs/policy.md)")
	tracePath = flag.String("devtrace", "../../../shared/workloads/mooncake_synthetic_trace.jsonl", "development trace for the reference and sweep tests")
	others    = flag.String("traces", "", "comma-separated traces of the format that the design has not seen, for TestOtherTraces")
)

// devSizes are the cache sizes measured on the development trace and its
// halves; sizeFractions those, as fractions of the distinct blocks, measured
// on the synthetic generators.
var (
	devSizes      = []int{1000, 2000, 5000, 10000, 20000}
	sizeFractions = []float64{0.025, 0.05, 0.1, 0.2, 0.4}
)

func devTrace(t testing.TB) []trace.Request {
	t.Helper()
	reqs, err := trace.ReadFile(*tracePath)
	if os.IsNotExist(err) || (err != nil && strings.Contains(err.Error(), "no such file")) {
		t.Skipf("development trace not present: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// TestReferenceFigures reproduces shared/workloads/README.md.
func TestReferenceFigures(t *testing.T) {
	w := Compile(devTrace(t))
	if w.Refs() != 121877 || w.Blocks() != 43924 {
		t.Fatalf("trace has %d refs, %d blocks; want 121877, 43924", w.Refs(), w.Blocks())
	}
	for _, c := range []struct {
		n           int
		lru, belady float64
	}{{2000, 0.144, 0.379}, {10000, 0.424, 0.618}, {20000, 0.572, 0.640}, {0, 0.640, 0.640}} {
		lru := w.Simulate(c.n, NewLRU()).HitRatio()
		bel := w.Simulate(c.n, NewBelady(w, c.n)).HitRatio()
		if math.Abs(lru-c.lru) > 0.002 || math.Abs(bel-c.belady) > 0.002 {
			t.Errorf("N=%d: LRU %.4f (want %.3f), Belady %.4f (want %.3f)", c.n, lru, c.lru, bel, c.belady)
		}
	}
}

func TestSimulateSmall(t *testing.T) {
	reqs := []trace.Request{
		{HashIDs: []int64{1, 2, 3}},
		{HashIDs: []int64{1, 2, 4}}, // 2 leading hits
		{HashIDs: []int64{5, 2, 3}}, // miss at head: 2 and 3 resident but not hits
		{HashIDs: []int64{1, 2, 3}}, // 3 hits
	}
	r := Simulate(reqs, 0, NewLRU())
	if r.Hits != 5 || r.Refs != 12 || r.LateBlocks != 2 || r.Inserts != 5 {
		t.Fatalf("unlimited: %+v", r)
	}
	// Capacity 3, LRU: request 2 evicts 3 for 4, request 3 evicts 1 and 4,
	// so request 4 misses at its head: 2 hits in all.
	r = Simulate(reqs, 3, NewLRU())
	if r.Hits != 2+0+0 || r.MaxBlocks != 3 {
		t.Fatalf("cap 3: %+v", r)
	}
	for _, n := range Names() {
		p, _ := New(n, 3)
		r := Simulate(reqs, 3, p)
		if r.MaxBlocks > 3 || r.Hits > 5 {
			t.Fatalf("%s: %+v", n, r)
		}
	}
}

// devBound is one cache size of the development trace with the two ends of
// its LRU→Belady gap.
type devBound struct {
	n        int
	lru, bel float64
}

// devBounds compiles the development trace and measures LRU and Belady at
// the sizes the diagnostics report (2,000 and 10,000 blocks).
func devBounds(t *testing.T) (*Workload, []devBound) {
	t.Helper()
	w := Compile(devTrace(t))
	var bs []devBound
	for _, n := range []int{2000, 10000} {
		bs = append(bs, devBound{n, w.Simulate(n, NewLRU()).HitRatio(), w.Simulate(n, NewBelady(w, n)).HitRatio()})
	}
	return w, bs
}

func gapFrac(p, lru, bel float64) float64 {
	if bel-lru < 1e-9 {
		return math.NaN()
	}
	return (p - lru) / (bel - lru)
}

type workloadCase struct {
	name  string
	w     *Workload
	sizes []int
}

// synthetic returns the generator workloads with sizes at 2.5%, 5%, 10%,
// 20% and 40% of each trace's distinct blocks, so that every trace is
// measured from a tight to a roomy cache.
func synthetic() []workloadCase { return syntheticSeeds(1, 2) }

// syntheticSeeds returns the generators' traces for seeds, each at 2.5, 5,
// 10, 20 and 40% of its distinct blocks.
func syntheticSeeds(seeds ...uint64) []workloadCase {
	var out []workloadCase
	for _, g := range []struct {
		name string
		gen  func(uint64, int) []trace.Request
	}{{"chat", trace.Chat}, {"docs", trace.Docs}, {"mixed", trace.Mixed}} {
		for _, seed := range seeds {
			w := Compile(g.gen(seed, 4000))
			var sizes []int
			for _, f := range sizeFractions {
				sizes = append(sizes, max(1, int(f*float64(w.Blocks()))))
			}
			out = append(out, workloadCase{fmt.Sprintf("%s/seed%d", g.name, seed), w, sizes})
		}
	}
	return out
}

// TestDefaultBeatsLRU checks the default never loses more than lruTolerance
// to LRU on the development trace, its halves, and the synthetic generators
// at seeds 1 and 2. lruTolerance is the hit ratio the default may give up
// against LRU in roomy caches; the most it gives up at these five sizes on
// held-out traces is 0.0014 (chat seeds 15–20, TestHeldOutSeeds; Mooncake's
// traces, TestOtherTraces: 0.0007). At other sizes it gives up more (0.0054,
// TestQuarterOctaveSweep), which this tolerance does not cover.
const lruTolerance = 0.002

// TestDefaultGapOnDevTrace guards the default's measured gain on the
// development trace: the fraction of the LRU→Belady gap it closes.
func TestDefaultGapOnDevTrace(t *testing.T) {
	reqs, err := trace.ReadFile(*tracePath)
	if err != nil {
		t.Skipf("development trace not available: %v", err)
	}
	w := Compile(reqs)
	for _, tt := range []struct {
		n   int
		min float64
	}{{2000, 0.04}, {10000, 0.15}} {
		lru := w.Simulate(tt.n, NewLRU()).HitRatio()
		bel := w.Simulate(tt.n, NewBelady(w, tt.n)).HitRatio()
		p, _ := New(Default, tt.n)
		got := w.Simulate(tt.n, p).HitRatio()
		gap := (got - lru) / (bel - lru)
		t.Logf("N=%d: LRU %.4f, %s %.4f, Belady %.4f: %.1f%% of the gap", tt.n, lru, Default, got, bel, 100*gap)
		if gap < tt.min {
			t.Errorf("N=%d: %s closes %.1f%% of the LRU→Belady gap, want ≥ %.0f%%", tt.n, Default, 100*gap, 100*tt.min)
		}
	}
}

func TestDefaultBeatsLRU(t *testing.T) {
	cases := synthetic()
	if reqs, err := trace.ReadFile(*tracePath); err == nil {
		a, b := trace.Split(reqs)
		dev := devSizes
		cases = append(cases, workloadCase{"dev", Compile(reqs), dev},
			workloadCase{"dev/first-half", Compile(a), dev}, workloadCase{"dev/second-half", Compile(b), dev})
	}
	if testing.Short() {
		cases = cases[len(cases)-1:]
	}
	for _, c := range cases {
		for _, n := range c.sizes {
			lru := c.w.Simulate(n, NewLRU()).HitRatio()
			def, _ := New(Default, n)
			got := c.w.Simulate(n, def).HitRatio()
			// An online learner may lose a sliver where LRU is already
			// near-optimal; more than 0.002 of hit ratio is a regression.
			if got < lru-lruTolerance {
				t.Errorf("%s N=%d: %s %.4f < LRU %.4f", c.name, n, Default, got, lru)
			}
		}
	}
}

// TestDefaultNeverBelowLRUOnDevTrace checks the default on the development
// trace at every quarter octave of cache size from 250 to 64,000 blocks
// (past its 43,924 distinct blocks), without tolerance: nowhere below LRU.
// Above about 25,000 blocks the cache turns over less than once in the
// trace, so the warm-up keeps it level with LRU there; a variant that ended
// the warm-up early (docs/policy.md, "Warm-up") fell 0.0001 below LRU at
// 38,055 blocks.
func TestDefaultNeverBelowLRUOnDevTrace(t *testing.T) {
	reqs, err := trace.ReadFile(*tracePath)
	if err != nil {
		t.Skipf("development trace not available: %v", err)
	}
	if testing.Short() {
		t.Skip("33 cache sizes")
	}
	w := Compile(reqs)
	for _, n := range quarterOctaves(64000) {
		lru := w.Simulate(n, NewLRU()).HitRatio()
		def, _ := New(Default, n)
		if got := w.Simulate(n, def).HitRatio(); got < lru {
			t.Errorf("N=%d: %s %.5f < LRU %.5f", n, Default, got, lru)
		}
	}
}

// quarterOctaves returns the cache sizes 250 × 2^(i/4) blocks, rounded, up
// to limit.
func quarterOctaves(limit int) []int {
	var out []int
	for i := 0; ; i++ {
		n := int(math.Round(250 * math.Exp2(float64(i)/4)))
		if n > limit {
			return out
		}
		out = append(out, n)
	}
}

// TestQuarterOctaveSweep measures the default against LRU at every quarter
// octave of cache size below each trace's distinct blocks, on the
// development trace and its halves and on -traces (whole and halves), and
// prints the cells where it is below LRU and the per-trace tally
// (docs/policy.md, "Quarter-octave sweep"). It asserts nothing: the five
// sizes of TestDefaultBeatsLRU and TestOtherTraces carry the tolerance, and
// TestDefaultNeverBelowLRUOnDevTrace the development trace itself.
//
//	go test ./tiers/policy -run TestQuarterOctaveSweep -sweep -v [-traces FILE[,FILE]]
func TestQuarterOctaveSweep(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to run the quarter-octave sweep")
	}
	paths := []string{*tracePath}
	if *others != "" {
		paths = append(paths, strings.Split(*others, ",")...)
	}
	for _, path := range paths {
		for _, c := range traceParts(t, path) {
			cells, below, worst, sum := 0, 0, 0.0, 0.0
			for _, n := range quarterOctaves(c.w.Blocks() - 1) {
				lru := c.w.Simulate(n, NewLRU()).HitRatio()
				bel := c.w.Simulate(n, NewBelady(c.w, n)).HitRatio()
				def, _ := New(Default, n)
				got := c.w.Simulate(n, def).HitRatio()
				cells++
				if g := gapFrac(got, lru, bel); !math.IsNaN(g) {
					sum += g
				}
				if got < lru {
					below++
					worst = min(worst, got-lru)
					ch := c.w.Simulate(n, NewChain(n)).HitRatio()
					fmt.Printf("%s, %s, N=%d: %s %.4f < LRU %.4f (%+.4f); chain %.4f, Belady %.4f\n",
						path, c.name, n, Default, got, lru, got-lru, ch, bel)
				}
			}
			fmt.Printf("%s, %s: %d sizes from 250 blocks, mean gap closed %+.1f%%, below LRU in %d, worst %+.4f\n",
				path, c.name, cells, 100*sum/float64(cells), below, worst)
		}
	}
}

// TestSweep prints the comparison tables of docs/policy.md:
//
//	go test ./tiers/policy -run TestSweep -sweep -v
func TestSweep(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to print the comparison tables")
	}
	reqs := devTrace(t)
	a, b := trace.Split(reqs)
	dev := devSizes
	cases := append([]workloadCase{{"dev (mooncake_synthetic_trace)", Compile(reqs), dev},
		{"dev, first half", Compile(a), dev}, {"dev, second half", Compile(b), dev}}, synthetic()...)
	order := []string{"lru", "lru2", "arc", "s3fifo", "hyper", "density", "lrb", "chain"}
	for _, c := range cases {
		var sb strings.Builder
		fmt.Fprintf(&sb, "\n%s: %d requests, %d block refs, %d distinct blocks\n\n", c.name, len(c.w.Reqs), c.w.Refs(), c.w.Blocks())
		sb.WriteString("| policy |")
		for _, n := range c.sizes {
			fmt.Fprintf(&sb, " N=%d |", n)
		}
		sb.WriteString("\n| --- |" + strings.Repeat(" --- |", len(c.sizes)) + "\n")
		lru := make([]float64, len(c.sizes))
		bel := make([]float64, len(c.sizes))
		for i, n := range c.sizes {
			lru[i] = c.w.Simulate(n, NewLRU()).HitRatio()
			bel[i] = c.w.Simulate(n, NewBelady(c.w, n)).HitRatio()
		}
		for _, name := range order {
			fmt.Fprintf(&sb, "| %s |", name)
			for i, n := range c.sizes {
				p, _ := New(name, n)
				h := c.w.Simulate(n, p).HitRatio()
				if name == "lru" {
					fmt.Fprintf(&sb, " %.3f |", h)
				} else if g := gapFrac(h, lru[i], bel[i]); math.IsNaN(g) {
					fmt.Fprintf(&sb, " %.3f (—) |", h)
				} else {
					fmt.Fprintf(&sb, " %.3f (%+.0f%%) |", h, 100*g)
				}
			}
			sb.WriteString("\n")
		}
		sb.WriteString("| reuse oracle (offline) |")
		for i, n := range c.sizes {
			h := c.w.Simulate(n, NewReuseOracle(c.w)).HitRatio()
			if g := gapFrac(h, lru[i], bel[i]); math.IsNaN(g) {
				fmt.Fprintf(&sb, " %.3f (—) |", h)
			} else {
				fmt.Fprintf(&sb, " %.3f (%+.0f%%) |", h, 100*g)
			}
		}
		sb.WriteString("\n")
		sb.WriteString("| belady |")
		for i := range c.sizes {
			fmt.Fprintf(&sb, " %.3f |", bel[i])
		}
		sb.WriteString("\n")
		fmt.Print(sb.String())
	}
}

// TestHeldOutSeeds measures the default, the default without its warm-up,
// the default without its referee and chain against LRU on generator seeds
// that TestDefaultBeatsLRU does not use, per generator: the mean fraction of
// the LRU→Belady gap closed, how many cells fall below LRU and by how much
// at worst (docs/policy.md, "Held-out generator seeds"). Seeds 3–8 were held
// out until the referee was designed on them; seeds 9–14 were first run
// after it was fixed, seeds 15–20 after the warm-up was.
//
//	go test ./tiers/policy -run TestHeldOutSeeds -sweep -v
func TestHeldOutSeeds(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to measure the held-out generator seeds")
	}
	type tally struct {
		cells, below int
		sum, worst   float64
	}
	variants := []struct {
		name string
		mk   func(n int) Policy
	}{
		{Default, func(n int) Policy { p, _ := New(Default, n); return p }},
		{"nowarm", func(n int) Policy { p := NewDensity(n); p.noWarm = true; return p }},
		{"noref", func(n int) Policy { p := NewDensity(n); p.noRef = true; return p }},
		{"chain", func(n int) Policy { return NewChain(n) }},
	}
	for _, set := range []struct {
		name  string
		seeds []uint64
	}{{"seeds 3-8", []uint64{3, 4, 5, 6, 7, 8}}, {"seeds 9-14", []uint64{9, 10, 11, 12, 13, 14}}, {"seeds 15-20", []uint64{15, 16, 17, 18, 19, 20}}} {
		out := map[string]map[string]*tally{}
		var gens []string
		for _, c := range syntheticSeeds(set.seeds...) {
			gen, _, _ := strings.Cut(c.name, "/")
			if out[gen] == nil {
				out[gen] = map[string]*tally{}
				gens = append(gens, gen)
			}
			for _, n := range c.sizes {
				lru := c.w.Simulate(n, NewLRU()).HitRatio()
				bel := c.w.Simulate(n, NewBelady(c.w, n)).HitRatio()
				for _, v := range variants {
					h := c.w.Simulate(n, v.mk(n)).HitRatio()
					tl := out[gen][v.name]
					if tl == nil {
						tl = &tally{}
						out[gen][v.name] = tl
					}
					tl.cells++
					if h < lru {
						tl.below++
					}
					tl.worst = min(tl.worst, h-lru)
					if g := gapFrac(h, lru, bel); !math.IsNaN(g) {
						tl.sum += g
					}
					if h < lru-0.0005 {
						t.Logf("%s N=%d: %s %.4f, LRU %.4f, Belady %.4f", c.name, n, v.name, h, lru, bel)
					}
				}
			}
		}
		for _, gen := range gens {
			for _, v := range variants {
				tl := out[gen][v.name]
				fmt.Printf("%-10s %-6s %-8s %d cells: mean gap closed %+.1f%%, below LRU in %d, worst %+.4f\n",
					set.name, gen, v.name, tl.cells, 100*tl.sum/float64(tl.cells), tl.below, tl.worst)
			}
		}
	}
}

// TestOtherTraces measures the default against LRU, chain and Belady on
// traces of the format that no design decision saw (-traces FILE[,FILE]):
// each whole and halved, at 1,000 to 20,000 blocks and at 2.5 to 40% of its
// distinct blocks. It fails where the default trails LRU by more than
// lruTolerance (docs/policy.md, "Other traces of the format"):
//
//	go test ./tiers/policy -run TestOtherTraces -traces conversation_trace.jsonl -v
func TestOtherTraces(t *testing.T) {
	if *others == "" {
		t.Skip("pass -traces FILE[,FILE] to measure other traces of the format")
	}
	for _, path := range strings.Split(*others, ",") {
		for _, c := range traceParts(t, path) {
			fmt.Printf("\n%s, %s: %d requests, %d block refs, %d distinct blocks\n", path, c.name, len(c.w.Reqs), c.w.Refs(), c.w.Blocks())
			below, sum, cells := 0, 0.0, 0
			for _, n := range otherSizes(c.w.Blocks()) {
				lru := c.w.Simulate(n, NewLRU()).HitRatio()
				bel := c.w.Simulate(n, NewBelady(c.w, n)).HitRatio()
				def, _ := New(Default, n)
				got := c.w.Simulate(n, def).HitRatio()
				ch := c.w.Simulate(n, NewChain(n)).HitRatio()
				fmt.Printf("N=%-7d LRU %.4f  %s %.4f (%s)  chain %.4f (%s)  Belady %.4f\n",
					n, lru, Default, got, pctGap(got, lru, bel), ch, pctGap(ch, lru, bel), bel)
				cells++
				if got < lru {
					below++
				}
				if g := gapFrac(got, lru, bel); !math.IsNaN(g) {
					sum += g
				}
				if got < lru-lruTolerance {
					t.Errorf("%s, %s, N=%d: %s %.4f < LRU %.4f", path, c.name, n, Default, got, lru)
				}
			}
			fmt.Printf("%d cells: mean gap closed %+.1f%%, below LRU in %d\n", cells, 100*sum/float64(cells), below)
		}
	}
}

// tracePart is a trace, or one of its halves, compiled for simulation.
type tracePart struct {
	name string
	w    *Workload
}

// traceParts reads the trace at path and compiles it whole and in halves.
func traceParts(t *testing.T, path string) []tracePart {
	t.Helper()
	reqs, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a, b := trace.Split(reqs)
	return []tracePart{{"whole", Compile(reqs)}, {"first half", Compile(a)}, {"second half", Compile(b)}}
}

// pctGap formats the gap closed, or "no gap" where LRU is already optimal.
func pctGap(h, lru, bel float64) string {
	g := gapFrac(h, lru, bel)
	if math.IsNaN(g) {
		return "no gap"
	}
	return fmt.Sprintf("%+.1f%%", 100*g)
}

// otherSizes returns the cache sizes TestOtherTraces measures for a trace
// of the given distinct blocks: the development trace's sizes and the
// generators' fractions, ascending, each below the trace's distinct blocks.
func otherSizes(blocks int) []int {
	set := map[int]bool{}
	for _, n := range devSizes {
		set[n] = true
	}
	for _, f := range sizeFractions {
		set[max(1, int(f*float64(blocks)))] = true
	}
	var out []int
	for n := range set {
		if n < blocks {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
