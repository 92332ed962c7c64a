package tiers

import (
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
)

// TestExpiryRacesResume: expireLoop collects the parked keys whose TTL
// passed, then deletes them; a request resumed in that window (and parked
// again under the same id) must neither lose its new blocks nor be counted
// expired.
func TestExpiryRacesResume(t *testing.T) {
	const bs = 64 << 10
	const ttl = 100 * time.Millisecond
	tests := []struct {
		name   string
		repark bool // parked again under the same id after the resume
	}{
		{name: "resumed"},
		{name: "resumed and parked again", repark: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := Key{NS: 8 | ParkedNS, Hash: shm.Hash{Hi: 5000 + uint64(i), Lo: 0}}
			later := Key{NS: 8 | ParkedNS, Hash: shm.Hash{Hi: 6000 + uint64(i), Lo: 0}}
			laterSeen := make(chan struct{})
			raced := false
			var expiredBefore uint64 // kvtier_parked_expired_total before later's own expiry
			r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20,
				cfg: ChainConfig{ParkTTL: ttl}, noStart: true})
			park := func(k Key) { // as a session does; not on the test's goroutine
				hd, err := r.c.Reserve(k, bs)
				if err != nil {
					t.Errorf("reserve %v: %v", k, err)
					return
				}
				fillFor(r.h.Bytes(hd), k)
				if err := r.h.Commit(hd); err != nil {
					t.Errorf("commit %v: %v", k, err)
					return
				}
				r.c.Park(k)
			}
			r.c.expireHook = func(k Key) { // in expireLoop, after it saw k expired
				switch {
				case k == target && !raced:
					raced = true
					r.c.Delete(target) // the request is resumed
					if tt.repark {
						park(target)
						r.c.parkMu.Lock()
						r.c.parked[target] = time.Now().Add(time.Hour)
						r.c.parkMu.Unlock()
					}
					// Parked after this pass collected its keys: seen by
					// a later pass, once target's delete is done.
					park(later)
				case k == later:
					select {
					case <-laterSeen:
					default:
						expiredBefore = r.c.Stats().ParkExpired
						close(laterSeen)
					}
				}
			}
			r.start()
			r.putHost(t, target, bs)
			select {
			case <-laterSeen:
			case <-time.After(10 * time.Second):
				t.Fatal("expireLoop did not reach the block parked after the race")
			}
			if got := expiredBefore; got != 0 {
				t.Errorf("kvtier_parked_expired_total %d, want 0: the request was resumed before its delete", got)
			}
			if tt.repark && !r.inAny(target) {
				t.Errorf("block parked again after the resume deleted by the expiry of the old one (parked %v)", r.c.isParked(target))
			}
		})
	}
}
