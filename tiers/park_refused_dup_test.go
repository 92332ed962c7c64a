package tiers

import (
	"errors"
	"testing"
	"time"
)

// TestParkedShareDuplicateIsExists: a put of a parked block the host tier
// already holds (reserved, or committed and waiting for its write-through)
// is a duplicate (ErrExists), as it is below the share; past the share it
// was refused as ErrFull and counted in ParkRefused
// (kvtier_park_refused_total), though the share refused nothing: the
// engine recomputed a request whose block was held.
func TestParkedShareDuplicateIsExists(t *testing.T) {
	const size = 256 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20,
		cfg: ChainConfig{ParkTTL: time.Hour, ParkedShare: 0.25}})
	held := Key{NS: 3 | ParkedNS, Hash: chainKey(92, 0).Hash}
	hd, err := r.c.Reserve(held, size)
	if err != nil {
		t.Fatal(err)
	}
	defer r.h.Abort(hd)
	refused := uint64(0)
	for i := 1; refused == 0; i++ {
		k := Key{NS: 3 | ParkedNS, Hash: chainKey(92, uint64(i)).Hash}
		h, err := r.c.Reserve(k, size)
		if errors.Is(err, ErrFull) {
			refused++
			break
		}
		if err != nil {
			t.Fatalf("reserve parked block %d: %v", i, err)
		}
		fillFor(r.h.Bytes(h), k)
		if err := r.h.Commit(h); err != nil {
			t.Fatal(err)
		}
		r.c.Park(k)
		eventually(t, 5*time.Second, "the write-through", func() bool { return r.store.Contains(nk(k)) })
	}
	if got := r.c.Stats().ParkRefused; got != refused {
		t.Fatalf("ParkRefused %d after %d refusal", got, refused)
	}
	if _, err := r.c.Reserve(held, size); !errors.Is(err, ErrExists) {
		t.Errorf("put of a parked block held in the host tier: %v, want ErrExists", err)
	}
	if got := r.c.Stats().ParkRefused; got != refused {
		t.Errorf("ParkRefused %d, want %d: a duplicate put counted as refused by the share", got, refused)
	}
}
