package tiers

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/tiers/nvme"
)

// TestFlushKeepsRecencyOrder: a flush writes the host tier down oldest
// first, one run after another, so that after a restart (NVMe orders its
// blocks by write order) the NVMe tier's recency is the host tier's. The
// flush wrote in map order on parallel writers, and a restarted store
// then evicted some of the hottest blocks first.
func TestFlushKeepsRecencyOrder(t *testing.T) {
	const bs, n = 64 << 10, 64
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true, cfg: ChainConfig{Policy: "lru"}})
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = chainKey(41, uint64(i))
		r.putHost(t, keys[i], bs)
	}
	// Touched in a known order: want is the host tier's recency, oldest
	// first.
	want := make([]Key, n)
	for i, j := range rand.New(rand.NewPCG(4, 1)).Perm(n) {
		want[i] = keys[j]
		hd, ok := r.h.Acquire(keys[j])
		if !ok {
			t.Fatalf("%v not in the host tier", keys[j])
		}
		if err := r.h.Release(hd); err != nil {
			t.Fatal(err)
		}
	}
	if wrote, err := r.c.Flush(context.Background()); err != nil || wrote != n {
		t.Fatalf("flush wrote %d blocks (err %v), want %d", wrote, err, n)
	}

	// The restart: the store reopened from its index.
	if err := r.store.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := nvme.Open(context.Background(), nvme.Options{Dir: r.dir, CapacityBytes: nvme.MinCapacity, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var got []Key
	st.Keys(func(k nvme.Key, _ int64) bool { // least recently used first
		got = append(got, Key{NS: k.NS, Hash: k.Hash})
		return true
	})
	if len(got) != n {
		t.Fatalf("reopened store holds %d blocks, want %d", len(got), n)
	}
	wrong := 0
	for i := range want {
		if got[i] != want[i] {
			wrong++
		}
	}
	if wrong > 0 {
		t.Errorf("after a flush and a restart, %d of %d blocks are out of the host tier's recency order", wrong, n)
	}
}
