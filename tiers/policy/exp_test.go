package policy

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

var expVariants = map[string]func(n int) Policy{
	"density":  func(n int) Policy { return NewDensity(n) },
	"norm":     func(n int) Policy { p := NewDensity(n); p.norm = true; return p },
	"normeb":   func(n int) Policy { p := NewDensity(n); p.norm, p.eb = true, true; return p },
	"norm5":    func(n int) Policy { p := NewDensity(n); p.norm, p.refB = true, 5; return p },
	"norm8":    func(n int) Policy { p := NewDensity(n); p.norm, p.refB = true, 8; return p },
	"norm2":    func(n int) Policy { p := NewDensity(n); p.norm, p.refB = true, 1; return p },
	"norm3up":  func(n int) Policy { p := NewDensity(n); p.norm, p.normMin = true, 3; return p },
	"norm4up":  func(n int) Policy { p := NewDensity(n); p.norm, p.normMin = true, 4; return p },
	"normlife": func(n int) Policy { p := NewDensity(n); p.norm, p.life = true, true; return p },
	"denslife": func(n int) Policy { p := NewDensity(n); p.life = true; return p },
	"normlast": func(n int) Policy { p := NewDensity(n); p.norm, p.gmode = true, 1; return p },
	"normewma": func(n int) Policy { p := NewDensity(n); p.norm, p.gmode = true, 2; return p },
	"normgeo":  func(n int) Policy { p := NewDensity(n); p.norm, p.gmode = true, 3; return p },
	"normlb":   func(n int) Policy { p := NewDensity(n); p.norm, p.lastBit = true, true; return p },
	"denslb":   func(n int) Policy { p := NewDensity(n); p.lastBit = true; return p },
	"normms":   func(n int) Policy { p := NewDensity(n); p.norm, p.ms = true, true; return p },
	"normebms": func(n int) Policy {
		p := NewDensity(n)
		p.norm, p.eb, p.ms = true, true, true
		return p
	},
}

// TestExp compares experimental Density variants (EXP=comma list; EXPQUICK=1
// for the development trace at 2k/10k only).
func TestExp(t *testing.T) {
	if !*sweep {
		t.Skip()
	}
	names := strings.Split(os.Getenv("EXP"), ",")
	if names[0] == "" {
		names = []string{"density", "norm"}
	}
	reqs := devTrace(t)
	a, b := trace.Split(reqs)
	dev := []int{1000, 2000, 5000, 10000, 20000}
	cases := []workloadCase{{"dev", Compile(reqs), dev}}
	if os.Getenv("EXPQUICK") != "" {
		cases[0].sizes = []int{2000, 10000}
	} else {
		cases = append(cases, workloadCase{"h1", Compile(a), dev}, workloadCase{"h2", Compile(b), dev})
		if os.Getenv("EXPDEV") == "" {
			cases = append(cases, synthetic()...)
		}
	}
	for _, c := range cases {
		tg := trueGaps(c.w)
		expVariants["normtrue"] = func(n int) Policy {
			p := NewDensity(n)
			p.norm, p.trueGap = true, tg
			return p
		}
		dead := func(i uint64) bool { return c.w.next[i] == noNext }
		expVariants["normtruedead"] = func(n int) Policy {
			p := NewDensity(n)
			p.norm, p.trueGap, p.deadAt = true, tg, dead
			return p
		}
		expVariants["normdead"] = func(n int) Policy {
			p := NewDensity(n)
			p.norm, p.deadAt = true, dead
			return p
		}
		firstSeen := make([]bool, len(c.w.keys))
		{
			seen := map[Key]bool{}
			for i, k := range c.w.keys {
				firstSeen[i] = !seen[k]
				seen[k] = true
			}
		}
		dead1 := func(i uint64) bool { return firstSeen[i] && c.w.next[i] == noNext }
		dead2 := func(i uint64) bool { return !firstSeen[i] && c.w.next[i] == noNext }
		expVariants["normdead1"] = func(n int) Policy {
			p := NewDensity(n)
			p.norm, p.deadAt = true, dead1
			return p
		}
		expVariants["normdead2"] = func(n int) Policy {
			p := NewDensity(n)
			p.norm, p.deadAt = true, dead2
			return p
		}
		expVariants["densdead"] = func(n int) Policy {
			p := NewDensity(n)
			p.deadAt = dead
			return p
		}
		for _, n := range c.sizes {
			lru := c.w.Simulate(n, NewLRU()).HitRatio()
			bel := c.w.Simulate(n, NewBelady(c.w, n)).HitRatio()
			line := fmt.Sprintf("%-12s N=%-6d lru %.4f", c.name, n, lru)
			for _, name := range names {
				h := c.w.Simulate(n, expVariants[name](n)).HitRatio()
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

// trueGaps returns each block's mean gap over its whole life in references
// (future knowledge; diagnostics only).
func trueGaps(w *Workload) func(Key) float64 {
	first := map[Key]int{}
	last := map[Key]int{}
	cnt := map[Key]int{}
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
