package policy

import (
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

// BenchmarkOps measures one steady-state miss (Admit + Insert + Victim +
// Remove) plus one hit (Access) per iteration on a full policy, chains of 32
// blocks with 50% of requests reusing a recent prefix.
func BenchmarkOps(b *testing.B) {
	const capacity = 100000
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			p, _ := New(name, capacity)
			n := 0
			id := 0
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
				p.Access(k(id/2), a) // a hit or an ignored unknown key
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

// BenchmarkSimulate measures a whole replay of a synthetic trace.
func BenchmarkSimulate(b *testing.B) {
	for _, name := range Names() {
		w := Compile(trace.Mixed(1, 4000))
		b.Run(name, func(b *testing.B) {
			for range b.N {
				p, _ := New(name, 5000)
				w.Simulate(5000, p)
			}
			b.ReportMetric(float64(w.Refs())*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mrefs/s")
		})
	}
}
