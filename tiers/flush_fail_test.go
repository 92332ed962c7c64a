package tiers

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers/nvme"
)

// TestFlushReportsFailedWrites: a flush whose writes all failed (the NVMe
// store closed, a failed disk) returned 0 blocks and no error, so
// kvtierctl flush reported success; and a batch whose later chunk failed
// counted none of the blocks its earlier chunks stored.
func TestFlushReportsFailedWrites(t *testing.T) {
	t.Run("every write fails", func(t *testing.T) {
		const bs, n = 64 << 10, 8
		r := newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true, cfg: ChainConfig{Policy: "lru"}})
		for i := range uint64(n) {
			r.putHost(t, chainKey(44, i), bs)
		}
		if err := r.store.Close(); err != nil {
			t.Fatal(err)
		}
		wrote, err := r.c.Flush(context.Background())
		if wrote != 0 || err == nil || !strings.Contains(err.Error(), "8 of 8 blocks") || !errors.Is(err, nvme.ErrClosed) {
			t.Fatalf("flush to a closed NVMe store: %d blocks written, err %v; want 0 and an error saying 8 of 8 blocks failed, wrapping nvme.ErrClosed", wrote, err)
		}
	})
	t.Run("a batch's second chunk fails", func(t *testing.T) {
		// One run, two chunks (a chunk is at most 1 MiB of records): the
		// two older blocks, then the larger newest one.
		sizes := []int64{300 << 10, 300 << 10, 700 << 10}
		r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true, cfg: ChainConfig{Policy: "lru"}})
		for i, size := range sizes {
			r.putHost(t, chainKey(45, uint64(i)), size)
		}
		// Parked (unevictable) blocks fill the budget but for room enough
		// for the first chunk, not for the second even once it evicts the
		// first: refused, evicting nothing. A chunk's blocks need their
		// size and twice the per-block overhead each.
		const overhead = 192
		room := func() int64 {
			st := r.store.Stats()
			return st.LogicalLimit - st.Bytes - int64(st.Blocks)*overhead
		}
		need1, need2 := sizes[0]+sizes[1]+4*overhead, sizes[2]+2*overhead
		target := (need1 + need2) / 2
		for i := uint64(0); ; i++ {
			size := min(int64(1<<20), room()-target-overhead)
			if size <= 0 {
				break
			}
			if err := r.store.Put(nvme.Key{NS: 9 | ParkedNS, Hash: chainKey(9, i).Hash}, make([]byte, size)); err != nil {
				t.Fatalf("fill: %v", err)
			}
		}
		if got := room(); got < need1 || got >= need2 {
			t.Fatalf("room %d after the fill, want at least %d and under %d", got, need1, need2)
		}
		wrote, err := r.c.Flush(context.Background())
		stored := 0
		for i := range sizes {
			if r.store.Contains(nk(chainKey(45, uint64(i)))) {
				stored++
			}
		}
		if stored != 2 {
			t.Fatalf("the store holds %d of the 3 blocks flushed, want the first chunk's 2 (the rig's budget is off)", stored)
		}
		if wrote != stored || err == nil || !strings.Contains(err.Error(), "1 of 3 blocks") || !errors.Is(err, nvme.ErrNoSpace) {
			t.Fatalf("flush reports %d blocks written, err %v; the store holds %d, want %d and an error saying 1 of 3 blocks failed, wrapping nvme.ErrNoSpace",
				wrote, err, stored, stored)
		}
	})
}
