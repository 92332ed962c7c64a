package tiers

import (
	"context"
	"testing"
)

// TestFlushWritesParkedBlocksFirst: a stop's write-down is bounded by the
// stop budget, and what it has not reached when cut is lost with the
// process. Parked blocks still in the host tier (queued for their
// write-through) are promised to survive, so a flush writes them before
// the ordinary blocks, however recently they were used.
func TestFlushWritesParkedBlocksFirst(t *testing.T) {
	const bs, n = 64 << 10, 4 * writeRun
	ctx, cut := context.WithCancel(context.Background())
	defer cut()
	puts := 0
	// noStart: nothing writes the parked blocks through, as when the
	// park writers are behind at a stop.
	r := newChainRig(t, rigOpts{hostBytes: 16 << 20, slabBytes: 1 << 20, noStart: true, cfg: ChainConfig{Policy: "lru"},
		hook: func(op string, k Key) {
			if op == "put" {
				if puts++; puts == writeRun {
					cut() // the budget ends after the first run
				}
			}
		}})
	for i := range uint64(n) { // ordinary blocks, older than the parked ones
		r.putHost(t, chainKey(44, i), bs)
	}
	var parked []Key
	for i := range uint64(writeRun) {
		k := chainKey(44|ParkedNS, i)
		r.putHost(t, k, bs)
		parked = append(parked, k)
	}
	wrote, err := r.c.Flush(ctx)
	if err == nil {
		t.Fatal("the flush was not cut")
	}
	missing := 0
	for _, k := range parked {
		if !r.store.Contains(nk(k)) {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("a flush cut after %d blocks wrote %d of the %d parked blocks", wrote, len(parked)-missing, len(parked))
	}
}
