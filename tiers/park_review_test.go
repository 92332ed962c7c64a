package tiers

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers/nvme"
)

// fillParkedNVMe puts parked filler blocks of size bytes straight into
// NVMe until its budget (full of unevictable blocks) refuses one, and
// returns their keys.
func fillParkedNVMe(t *testing.T, r *chainRig, sizes ...int64) []Key {
	t.Helper()
	var fill []Key
	for i := 0; ; i++ {
		k := Key{NS: 9 | ParkedNS, Hash: chainKey(95, uint64(i)).Hash}
		err := r.store.Put(nk(k), blockFor(k, sizes[0]))
		if errors.Is(err, nvme.ErrNoSpace) {
			if sizes = sizes[1:]; len(sizes) == 0 {
				return fill
			}
			continue
		}
		if err != nil {
			t.Fatalf("filler put %d: %v", i, err)
		}
		fill = append(fill, k)
		if i > 10000 {
			t.Fatal("the NVMe budget never filled with unevictable blocks")
		}
	}
}

// TestParkedPastHoldShareWrittenOnceRoom: parked blocks whose write-through
// failed (the disk budget full of parked blocks) past the host tier's share
// held for a retry (parkHoldShare) were unpinned as "ordinary host blocks
// again", but nothing ever wrote them down again: Park never told the
// policy of them, so the mover never picks them, and the retry list does
// not hold them. Once the disk had room again the held blocks went down,
// while those stayed in the host tier until an eviction dropped them (the
// request lost blocks with the disk half empty).
func TestParkedPastHoldShareWrittenOnceRoom(t *testing.T) {
	const size = 256 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20,
		cfg: ChainConfig{ParkTTL: time.Hour, ParkedShare: 1}})
	fill := fillParkedNVMe(t, r, size)
	// 5 MiB of parked blocks: 4 MiB (half the tier) are held for a retry,
	// the rest is unpinned.
	var keys []Key
	for i := range 20 {
		k := Key{NS: 3 | ParkedNS, Hash: chainKey(96, uint64(i)).Hash}
		r.putHost(t, k, size)
		keys = append(keys, k)
	}
	eventually(t, 10*time.Second, "the write-throughs to fail", func() bool { return r.c.Stats().ParkErrors == 20 })
	r.c.parkMu.Lock()
	held := len(r.c.parkRetry)
	r.c.parkMu.Unlock()
	if held != 16 {
		t.Fatalf("%d parked blocks held for a retry, want 16 (half the host tier)", held)
	}
	// Other requests are resumed: the disk has room for all of them.
	for _, k := range fill[:40] {
		if err := r.store.Delete(nk(k)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := 0
		for _, k := range keys {
			if !r.store.Contains(nk(k)) || r.h.Contains(k) {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d parked blocks still not written through 5 s after the disk had room (host parked bytes %d)",
				left, len(keys), r.h.ParkedBytes())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b := r.h.ParkedBytes(); b != 0 {
		t.Fatalf("host parked bytes %d after every parked block went down", b)
	}
	// Live traffic takes the whole host tier: the parked blocks are safe.
	for i := range 48 {
		hd, err := r.c.Reserve(chainKey(97, uint64(i)), size)
		if err != nil {
			continue
		}
		if err := r.h.Commit(hd); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		if !r.inAny(k) || !r.c.isParked(k) {
			t.Fatalf("parked block %v lost", k.Hash)
		}
	}
}

// TestParkRetryHoldShareDuringRetryPass: expireLoop took the blocks held
// for a retry and zeroed parkRetryBytes before writing them; parks failing
// meanwhile were held against an empty share, and the blocks of the pass
// not yet retried were put back without a check: parked blocks pinned
// after failed write-throughs took the whole host tier, not half of it.
func TestParkRetryHoldShareDuringRetryPass(t *testing.T) {
	const size = 64 << 10
	var gate atomic.Bool
	var first []Key
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(op string, k Key) {
		if op != "put" || !gate.Load() || !slices.Contains(first, k) {
			return
		}
		once.Do(func() { // the retry pass's first run, once
			close(entered)
			<-release
		})
	}
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, hook: hook,
		cfg: ChainConfig{ParkTTL: time.Hour, ParkedShare: 1}})
	var releaseOnce sync.Once
	open := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(open) // before the rig's: the pass must end for Wait
	limit := r.h.Stats().CapacityBytes / parkHoldShare
	fillParkedNVMe(t, r, 1<<20, size)
	for i := range int(limit / size) { // exactly the share held for retries
		k := Key{NS: 3 | ParkedNS, Hash: chainKey(98, uint64(i)).Hash}
		first = append(first, k)
	}
	for _, k := range first {
		r.putHost(t, k, size)
	}
	eventually(t, 10*time.Second, "the write-throughs to fail", func() bool { return r.c.Stats().ParkErrors == uint64(len(first)) })
	gate.Store(true)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no retry pass")
	}
	// Parks failing while the pass writes its first run.
	more := 48
	for i := range more {
		r.putHost(t, Key{NS: 4 | ParkedNS, Hash: chainKey(99, uint64(i)).Hash}, size)
	}
	eventually(t, 10*time.Second, "the new write-throughs to fail", func() bool {
		return r.c.Stats().ParkErrors == uint64(len(first)+more)
	})
	open()
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		r.c.parkMu.Lock()
		held, n := r.c.parkRetryBytes, int64(0)
		for _, hd := range r.c.parkRetry {
			n += hd.Size
		}
		r.c.parkMu.Unlock()
		if held > limit {
			t.Fatalf("%d bytes of parked blocks held pinned for a retry, share %d of a %d-byte host tier (%d leased)",
				held, limit, r.h.Stats().CapacityBytes, r.h.Stats().Leased)
		}
		if held < n {
			t.Fatalf("parkRetryBytes %d, held blocks sum to %d", held, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestParkedCopyLeasedDuringWriteThrough: a parked block read (a resume's
// lease) while its write-through ran is written to NVMe, but its host copy
// cannot be dropped then. It stayed in the host tier marked parked: counted
// twice against ParkedShare (NVMe's unevictable bytes and Host.ParkedBytes)
// after the lease was released, and, never told to the policy, never
// demoted, until an eviction or the request's delete.
func TestParkedCopyLeasedDuringWriteThrough(t *testing.T) {
	const size = 256 << 10
	k := Key{NS: 3 | ParkedNS, Hash: chainKey(100, 1).Hash}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(op string, hk Key) {
		if op == "put" && hk == k {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
	}
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, hook: hook,
		cfg: ChainConfig{ParkTTL: time.Hour, ParkedShare: 0.5}})
	var releaseOnce sync.Once
	open := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(open)
	r.putHost(t, k, size)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no write-through")
	}
	lease, ok := r.h.Acquire(k) // resumed while it is written
	if !ok {
		t.Fatal("parked block not in the host tier")
	}
	open()
	eventually(t, 5*time.Second, "the write-through", func() bool { return r.store.Contains(nk(k)) })
	time.Sleep(50 * time.Millisecond) // writeThrough's unpin
	if err := r.h.Release(lease); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for r.h.ParkedBytes() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("parked block on NVMe (%d unevictable bytes) still counted %d bytes in the host tier (in host: %v)",
				r.store.UnevictableBytes(), r.h.ParkedBytes(), r.h.Contains(k))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The host copy is a clean copy of NVMe's: the mover may drop it.
	if err := r.c.SetWatermarks(0.01, 0.005); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the clean host copy dropped by the mover", func() bool { return !r.h.Contains(k) })
	if !r.store.Contains(nk(k)) || !r.c.isParked(k) {
		t.Fatal("parked block lost")
	}
}
