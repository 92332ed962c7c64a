package tiers

import (
	"context"
	"testing"
)

// TestFlushCountsOnlyBlocksWritten: Flush returns how many blocks it wrote
// (kvtierctl flush prints it). A block deleted while its run was being
// written is left out of the store (writeDown's keep), yet was counted as
// written.
func TestFlushCountsOnlyBlocksWritten(t *testing.T) {
	const bs, n = 64 << 10, 8
	victim := chainKey(43, 3)
	var r *chainRig
	deleted := false
	r = newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, noStart: true, cfg: ChainConfig{Policy: "lru"},
		hook: func(op string, k Key) {
			if op == "put" && k == victim && !deleted {
				deleted = r.c.Delete(victim) // after the run was pinned, before its write
			}
		}})
	for i := range uint64(n) {
		r.putHost(t, chainKey(43, i), bs)
	}
	wrote, err := r.c.Flush(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !deleted {
		t.Fatal("the victim was not deleted during the flush")
	}
	if got := r.store.Stats().Blocks; wrote != got || got != n-1 {
		t.Fatalf("flush reports %d blocks written; the store holds %d, want %d", wrote, got, n-1)
	}
}
