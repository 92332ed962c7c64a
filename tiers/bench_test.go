package tiers

import (
	"testing"

	"github.com/kvtier/kvtier/shm"
)

// BenchmarkLookup probes a fully cached 1000-block chain, the daemon's
// prefix-match call for a long prompt.
func BenchmarkLookup(b *testing.B) {
	const n = 1000
	h, arena := newHost(b, 64<<10, 64) // 1024 slots of 4 KiB
	chain := make([]Key, n)
	for i := range chain {
		chain[i] = Key{NS: 1, Hash: shm.Hash{Hi: uint64(i) * 0x9e3779b97f4a7c15, Lo: uint64(i)}}
		put(b, h, arena, chain[i], 4096)
	}
	tiers := make([]shm.Tier, n)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if h.Lookup(chain, tiers) != n {
			b.Fatal("short lookup")
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkReserveCommit measures a PUT's bookkeeping. "fresh" allocates into
// free slots (the tier is emptied outside the timer when it fills); "evicting"
// runs at capacity so every Reserve evicts the LRU block.
func BenchmarkReserveCommit(b *testing.B) {
	for _, bc := range []struct {
		name  string
		evict bool
	}{{"fresh", false}, {"evicting", true}} {
		b.Run(bc.name, func(b *testing.B) {
			const slots = 4096
			h, _ := newHost(b, 64<<10, slots/16)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if !bc.evict && i%slots == 0 && i > 0 {
					b.StopTimer()
					h.DeleteNS(1)
					b.StartTimer()
				}
				hd, err := h.Reserve(Key{NS: 1, Hash: shm.Hash{Lo: uint64(i)}}, 4096)
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Commit(hd); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
