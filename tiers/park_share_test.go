package tiers

import (
	"errors"
	"testing"
	"time"
)

// TestParkedShareCapsParkedBlocks: parked blocks are unevictable on NVMe,
// so an engine that parked without end evicted every other model's blocks
// there until parked blocks filled the budget. With ParkedShare set, a
// parked reservation that would take the parked blocks on NVMe past that
// share of the budget is ErrFull (counted), and ordinary blocks are still
// taken; without it (0 or 1), parks go on.
func TestParkedShareCapsParkedBlocks(t *testing.T) {
	const size = 256 << 10
	for _, tc := range []struct {
		name   string
		share  float64
		capped bool
	}{
		{"share 0.25", 0.25, true},
		{"no share", 0, false},
		{"share 1", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20,
				cfg: ChainConfig{ParkTTL: time.Hour, ParkedShare: tc.share}})
			limit := int64(tc.share * float64(r.store.LogicalBudget()))
			// Park up to the whole budget: past the share.
			n := int(r.store.LogicalBudget()/size) - 4
			parked, refused := 0, 0
			for i := range n {
				k := Key{NS: 3 | ParkedNS, Hash: chainKey(90, uint64(i)).Hash}
				before := r.store.UnevictableBytes()
				hd, err := r.c.Reserve(k, size)
				if errors.Is(err, ErrFull) {
					refused++
					if !tc.capped {
						t.Fatalf("park %d refused (%v) with parked share %v", i, err, tc.share)
					}
					if before+size <= limit {
						t.Fatalf("park %d refused with %d parked bytes on NVMe of a %d-byte share", i, before, limit)
					}
					continue
				}
				if err != nil {
					t.Fatalf("reserve parked block %d: %v", i, err)
				}
				fillFor(r.h.Bytes(hd), k)
				if err := r.h.Commit(hd); err != nil {
					t.Fatal(err)
				}
				r.c.Park(k)
				parked++
				// Written through before the next: the cap counts NVMe.
				eventually(t, 5*time.Second, "the write-through", func() bool { return r.store.Contains(nk(k)) })
			}
			got := r.store.UnevictableBytes()
			t.Logf("%d parked (%d bytes on NVMe, share %d of %d), %d refused", parked, got, limit, r.store.LogicalBudget(), refused)
			if tc.capped {
				if refused == 0 || got > limit {
					t.Fatalf("%d parks refused, %d parked bytes on NVMe; want refusals and at most the share (%d)", refused, got, limit)
				}
				if s := r.c.Stats().ParkRefused; s != uint64(refused) {
					t.Fatalf("ParkRefused %d, want %d", s, refused)
				}
				if s := r.c.Stats().ParkedNVMeBytes; s != got {
					t.Fatalf("ParkedNVMeBytes %d, want %d", s, got)
				}
			} else if refused != 0 {
				t.Fatalf("%d parks refused without a share", refused)
			}
			// Ordinary blocks are not capped by it.
			r.putHost(t, chainKey(91, 1), size)
		})
	}
}
