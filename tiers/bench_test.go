package tiers

import (
	"math/rand/v2"
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

// BenchmarkDeleteReserveChurn is the daemon's DeleteBatch-then-refill
// pattern with one block size: 2 MiB blocks in 64 MiB slabs (32 slots), a
// full tier of 8 slabs, and per op 64 deletes of blocks picked at random
// (so they are spread over the slabs) followed by 64 Reserve+Commit of the
// same size. The freed slots are refilled in place, so no op should need to
// copy a block.
func BenchmarkDeleteReserveChurn(b *testing.B) {
	const (
		blockBytes = 2 << 20
		slabBytes  = 64 << 20
		slabs      = 8
		blocks     = slabs * slabBytes / blockBytes // 256
		batch      = 64
	)
	h, _ := newHost(b, slabBytes, slabs)
	keys := make([]Key, blocks)
	next := uint64(0)
	reserve := func(i int) {
		keys[i] = Key{NS: 1, Hash: shm.Hash{Lo: next}}
		next++
		hd, err := h.Reserve(keys[i], blockBytes)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Commit(hd); err != nil {
			b.Fatal(err)
		}
	}
	for i := range keys {
		reserve(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	perm := make([]int, blocks)
	for i := range perm {
		perm[i] = i
	}
	start := h.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < batch; j++ { // partial shuffle: perm[:batch] is the victim set
			r := j + rng.IntN(blocks-j)
			perm[j], perm[r] = perm[r], perm[j]
			if !h.Delete(keys[perm[j]]) {
				b.Fatal("delete missed")
			}
		}
		for j := 0; j < batch; j++ {
			reserve(perm[j])
		}
	}
	b.StopTimer()
	st := h.Stats()
	if st.Evictions != start.Evictions {
		b.Fatalf("churn evicted %d blocks", st.Evictions-start.Evictions)
	}
	b.ReportMetric(float64(st.Compactions-start.Compactions)/float64(b.N), "compactions/op")
	b.ReportMetric(float64(st.CompactedBlocks-start.CompactedBlocks)/float64(b.N), "moved/op")
}
