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

// TestParkedShareCountsBlocksOnTheirWayDown: the share counted only parked
// blocks already on NVMe, so a burst of parks (reserved, or committed and
// queued for their write-through) all passed the check and then took the
// parked blocks past the share. Parked blocks in the host tier count too
// (a host copy of a block NVMe holds, as a Resume's promotion makes, does
// not count twice).
func TestParkedShareCountsBlocksOnTheirWayDown(t *testing.T) {
	const size = 256 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20,
		cfg: ChainConfig{ParkTTL: time.Hour, ParkedShare: 0.25}})
	limit := int64(0.25 * float64(r.store.LogicalBudget()))
	// A burst: every reservation before any commit, as one batched Park of
	// a long request does.
	var hds []*Handle
	refused := 0
	for i := range 28 {
		k := Key{NS: 3 | ParkedNS, Hash: chainKey(92, uint64(i)).Hash}
		hd, err := r.c.Reserve(k, size)
		if errors.Is(err, ErrFull) {
			refused++
			continue
		}
		if err != nil {
			t.Fatalf("reserve parked block %d: %v", i, err)
		}
		hds = append(hds, hd)
	}
	if got := int64(len(hds)) * size; got > limit {
		t.Fatalf("%d parked reservations (%d bytes) granted at once with a parked share of %d bytes", len(hds), got, limit)
	}
	for _, hd := range hds {
		fillFor(r.h.Bytes(hd), hd.Key)
		if err := r.h.Commit(hd); err != nil {
			t.Fatal(err)
		}
		r.c.Park(hd.Key)
	}
	eventually(t, 5*time.Second, "the write-through", func() bool {
		for _, hd := range hds {
			if !r.store.Contains(nk(hd.Key)) {
				return false
			}
		}
		return true
	})
	if got := r.store.UnevictableBytes(); got > limit {
		t.Fatalf("%d parked bytes on NVMe after a burst, share %d", got, limit)
	}
	// On NVMe now, and promoted back to the host tier by a resume: the host
	// copies do not count again.
	eventually(t, 5*time.Second, "the host copies dropped", func() bool { return r.c.Host.ParkedBytes() == 0 })
	for _, hd := range hds[:2] {
		got := make(chan error, 1)
		lease, ok := r.c.Acquire(hd.Key, size, func(l *Handle, err error) {
			if err == nil {
				err = r.h.Release(l)
			}
			got <- err
		})
		if lease != nil || !ok {
			t.Fatalf("parked block %s: lease %v, found %v; want a promotion from NVMe", hd.Key.Hash, lease, ok)
		}
		if err := <-got; err != nil {
			t.Fatalf("promote parked block %s: %v", hd.Key.Hash, err)
		}
		if !r.h.Contains(hd.Key) {
			t.Fatalf("parked block %s not in the host tier after its promotion", hd.Key.Hash)
		}
	}
	if b := r.c.Host.ParkedBytes(); b != 0 {
		t.Fatalf("host copies of parked blocks held on NVMe count %d parked bytes, want 0", b)
	}
	t.Logf("%d granted, %d refused, %d parked bytes on NVMe of a %d-byte share", len(hds), refused, r.store.UnevictableBytes(), limit)
}
