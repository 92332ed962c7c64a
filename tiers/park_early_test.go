package tiers

import (
	"runtime"
	"testing"
	"time"
)

// TestParkBeforeStartQueuesWithoutGoroutines: a warm restart re-parks the
// parked blocks its host arena kept before Start, when nothing drains
// parkCh yet. Past its room they wait in a list, not in a goroutine each,
// and Start writes them all through to NVMe.
func TestParkBeforeStartQueuesWithoutGoroutines(t *testing.T) {
	const (
		block = 4096
		extra = 1000
	)
	r := newChainRig(t, rigOpts{hostBytes: 32 << 20, slabBytes: 1 << 20, nvmeBytes: 256 << 20, noStart: true})
	n := cap(r.c.parkCh) + extra // parkCh's room and more
	if int64(n)*block > 30<<20 {
		t.Fatalf("parkCh holds %d: the host tier is too small for the test", cap(r.c.parkCh))
	}
	before := runtime.NumGoroutine()
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = chainKey(7|ParkedNS, uint64(i))
		r.putHost(t, keys[i], block)
	}
	if grew := runtime.NumGoroutine() - before; grew > extra/10 {
		t.Fatalf("parking %d blocks before Start started %d goroutines, want none per block past parkCh's %d", n, grew, cap(r.c.parkCh))
	}
	r.start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		inNVMe, inHost := 0, 0
		for _, k := range keys {
			if r.store.Contains(nk(k)) {
				inNVMe++
			}
			if r.h.Contains(k) {
				inHost++
			}
		}
		if inNVMe == n && inHost == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after Start: %d of %d parked blocks in NVMe, %d still in the host tier", inNVMe, n, inHost)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, k := range keys {
		if got := r.c.isParked(k); !got {
			t.Fatalf("block %v is no longer parked after its write-through", k)
		}
	}
}
