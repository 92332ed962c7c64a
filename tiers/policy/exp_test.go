package policy

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

// TestExp compares Density with its experimental rate-normalized variant
// (norm) and with offline diagnostics that inject future knowledge
// (docs/policy.md, "What did not work"). It is skipped unless -sweep is
// given (-devtrace names another copy of the development trace):
//
//	EXP=density,norm,normtrue go test ./tiers/policy -run TestExp -count=1 -v -sweep
//
// EXP selects the variants (default: all); EXPQUICK=1 measures only the
// development trace at 2,000 and 10,000 blocks, EXPDEV=1 the development
// trace and its halves without the synthetic generators. A "!" marks a cell
// where the variant loses to LRU by more than lruTolerance.
func TestExp(t *testing.T) {
	if !*sweep {
		t.Skip("pass -sweep to compare the experimental variants")
	}
	all := []string{"density", "nowarm", "noref", "seed56", "seed78", "noshrink", "shrink4", "shrink64", "norm", "normtrue", "densdead", "normdead", "normdead1", "normdead2", "normtruedead"}
	names := all
	if e := os.Getenv("EXP"); e != "" {
		names = strings.Split(e, ",")
	}
	reqs := devTrace(t)
	a, b := trace.Split(reqs)
	dev := devSizes
	cases := []workloadCase{{"dev", Compile(reqs), dev}}
	switch {
	case os.Getenv("EXPQUICK") != "":
		cases[0].sizes = []int{2000, 10000}
	case os.Getenv("EXPDEV") != "":
		cases = append(cases, workloadCase{"h1", Compile(a), dev}, workloadCase{"h2", Compile(b), dev})
	default:
		cases = append(cases, workloadCase{"h1", Compile(a), dev}, workloadCase{"h2", Compile(b), dev})
		cases = append(cases, synthetic()...)
	}
	for _, c := range cases {
		variants := expVariants(c.w)
		for _, n := range c.sizes {
			lru := c.w.Simulate(n, NewLRU()).HitRatio()
			bel := c.w.Simulate(n, NewBelady(c.w, n)).HitRatio()
			line := fmt.Sprintf("%-12s N=%-6d lru %.4f", c.name, n, lru)
			for _, name := range names {
				mk, ok := variants[name]
				if !ok {
					t.Fatalf("unknown variant %q (have %v)", name, all)
				}
				h := c.w.Simulate(n, mk(n)).HitRatio()
				mark := ""
				if h < lru-lruTolerance {
					mark = "!"
				}
				line += fmt.Sprintf("  %s %.4f (%+.1f%%)%s", name, h, 100*gapFrac(h, lru, bel), mark)
			}
			fmt.Println(line)
		}
	}
}

// expVariants returns the variants for w: nowarm is density without its
// warm-up (its tables decide from the first eviction); noref is density
// without its referee (near ties decided by the tables alone); noshrink, shrink4 and shrink64 are
// density with its classes' hazards shrunk towards their group's with
// weight 0, 4 and 64 instead of dShrink; seed56 and seed78 are density with
// other seeds of its victim sampler, to tell noise from effects. The
// diagnostics know w's future:
//
//   - normtrue: norm with each block's true mean gap over its whole life
//     instead of the online estimate;
//   - densdead, normdead: density / norm told which reference of a block is
//     its last (the block is then refused or evicted first);
//   - normdead1, normdead2: norm told that only for blocks never referenced
//     again after their first reference (1), or only for the last reference
//     of blocks referenced at least twice (2);
//   - normtruedead: both true mean gaps and deaths.
func expVariants(w *Workload) map[string]func(n int) Policy {
	gap := trueGaps(w)
	first := make([]bool, len(w.keys))
	seen := make(map[Key]bool)
	for i, k := range w.keys {
		first[i] = !seen[k]
		seen[k] = true
	}
	dead := func(i uint64) bool { return w.next[i] == noNext }
	dead1 := func(i uint64) bool { return first[i] && w.next[i] == noNext }
	dead2 := func(i uint64) bool { return !first[i] && w.next[i] == noNext }
	mk := func(norm bool, g func(Key) float64, d func(uint64) bool) func(int) Policy {
		return func(n int) Policy {
			p := NewDensity(n)
			if norm {
				p.enableNorm()
			}
			p.trueGap, p.deadAt = g, d
			return p
		}
	}
	shrunk := func(k float64) func(int) Policy {
		return func(n int) Policy {
			p := NewDensity(n)
			p.shrink = k
			return p
		}
	}
	seeded := func(a, b uint64) func(int) Policy {
		return func(n int) Policy {
			p := NewDensity(n)
			p.rng = rand.New(rand.NewPCG(a, b))
			return p
		}
	}
	return map[string]func(n int) Policy{
		"nowarm": func(n int) Policy {
			p := NewDensity(n)
			p.noWarm = true
			return p
		},
		"noref": func(n int) Policy {
			p := NewDensity(n)
			p.noRef = true
			return p
		},
		"seed56":       seeded(5, 6),
		"seed78":       seeded(7, 8),
		"noshrink":     shrunk(0),
		"shrink4":      shrunk(4),
		"shrink64":     shrunk(64),
		"density":      mk(false, nil, nil),
		"norm":         mk(true, nil, nil),
		"normtrue":     mk(true, gap, nil),
		"densdead":     mk(false, nil, dead),
		"normdead":     mk(true, nil, dead),
		"normdead1":    mk(true, nil, dead1),
		"normdead2":    mk(true, nil, dead2),
		"normtruedead": mk(true, gap, dead),
	}
}

// trueGaps returns each block's mean gap over its whole life, in block
// references (future knowledge; diagnostics only).
func trueGaps(w *Workload) func(Key) float64 {
	first := make(map[Key]int)
	last := make(map[Key]int)
	cnt := make(map[Key]int)
	for i, k := range w.keys {
		if _, ok := first[k]; !ok {
			first[k] = i
		}
		last[k] = i
		cnt[k]++
	}
	return func(k Key) float64 {
		if cnt[k] < 2 {
			return 1e12
		}
		return float64(last[k]-first[k]) / float64(cnt[k]-1)
	}
}
