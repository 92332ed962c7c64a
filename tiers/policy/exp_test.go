package policy

import (
	"fmt"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

func TestExp(t *testing.T) {
	if !*sweep {
		t.Skip()
	}
	reqs := devTrace(t)
	a, b := trace.Split(reqs)
	dev := []int{1000, 2000, 5000, 10000, 20000}
	cases := append([]workloadCase{{"dev", Compile(reqs), dev},
		{"h1", Compile(a), dev}, {"h2", Compile(b), dev}}, synthetic()...)
	variants := map[string]func(n int) Policy{
		"density": func(n int) Policy { return NewDensity(n) },
		"norm":    func(n int) Policy { p := NewDensity(n); p.norm = true; return p },
	}
	for _, c := range cases {
		for _, n := range c.sizes {
			lru := c.w.Simulate(n, NewLRU()).HitRatio()
			bel := c.w.Simulate(n, NewBelady(c.w, n)).HitRatio()
			line := fmt.Sprintf("%-12s N=%-6d lru %.4f", c.name, n, lru)
			for _, name := range []string{"density", "norm"} {
				h := c.w.Simulate(n, variants[name](n)).HitRatio()
				line += fmt.Sprintf("  %s %.4f (%+.1f%%)", name, h, 100*gapFrac(h, lru, bel))
			}
			fmt.Println(line)
		}
	}
}
