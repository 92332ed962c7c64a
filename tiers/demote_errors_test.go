package tiers

import (
	"testing"
)

// TestDemoteErrorsCountBlocks: kvtier_move_errors_total{from="host"} and
// kvtier_errors_total{kind="demote"} count blocks, like
// kvtier_moves_total and the promotion errors: a failed write of a batch
// of blocks counts each of them.
func TestDemoteErrorsCountBlocks(t *testing.T) {
	const bs, n = 64 << 10, 40
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true})
	for i := range n {
		r.putHost(t, chainKey(47, uint64(i)), bs)
	}
	if err := r.store.Close(); err != nil { // every write fails from here on
		t.Fatal(err)
	}
	wrote, err := r.c.Flush(t.Context())
	if err != nil || wrote != 0 {
		t.Fatalf("flush to a closed store: wrote %d, %v", wrote, err)
	}
	if st := r.c.Stats(); st.DemoteErrors != n {
		t.Fatalf("demote errors %d after %d blocks failed to go down, want %d", st.DemoteErrors, n, n)
	}
}
