package tiers

import (
	"errors"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers/nvme"
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
	if !errors.Is(err, nvme.ErrClosed) || wrote != 0 {
		t.Fatalf("flush to a closed store: wrote %d, %v; want 0 and nvme.ErrClosed", wrote, err)
	}
	if st := r.c.Stats(); st.DemoteErrors != n {
		t.Fatalf("demote errors %d after %d blocks failed to go down, want %d", st.DemoteErrors, n, n)
	}
}

// TestSwapOutTimeIsOfMovedBlocks: the host → nvme move's copy time
// (ChainStats.SwapOut, kvtierctl top's MEAN COPY over Demoted) covers the
// blocks counted as moved: a flush writes blocks down without moving them,
// and a parked block written through moves with its copy time.
func TestSwapOutTimeIsOfMovedBlocks(t *testing.T) {
	const bs, n = 64 << 10, 20
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20})
	for i := range n {
		r.putHost(t, chainKey(48, uint64(i)), bs)
	}
	wrote, err := r.c.Flush(t.Context())
	if err != nil || wrote != n {
		t.Fatalf("flush: wrote %d, %v", wrote, err)
	}
	if st := r.c.Stats(); st.Demoted != 0 || st.SwapOut != 0 {
		t.Fatalf("after a flush (nothing moved): demoted %d, copy time %v; want 0 and 0", st.Demoted, st.SwapOut)
	}
	parked := Key{NS: 48 | ParkedNS, Hash: chainKey(48, 1000).Hash}
	r.putHost(t, parked, bs)
	eventually(t, 5*time.Second, "parked block not written through", func() bool { return r.c.Stats().Demoted == 1 })
	if st := r.c.Stats(); st.SwapOut <= 0 {
		t.Fatalf("parked block moved down with copy time %v", st.SwapOut)
	}
}
