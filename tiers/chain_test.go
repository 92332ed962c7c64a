package tiers

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
	"github.com/kvtier/kvtier/tiers/policy"
)

// chainRig is a Chain over a host tier in ordinary memory and a real
// nvme.Store in a temporary directory.
type chainRig struct {
	c      *Chain
	h      *Host
	store  *nvme.Store
	dir    string
	ctx    context.Context
	cancel context.CancelFunc
}

type rigOpts struct {
	hostBytes, slabBytes int64
	nvmeBytes            int64 // default nvme.MinCapacity
	cfg                  ChainConfig
	hook                 func(op string, k Key) // Chain.ioHook
	noStart              bool                   // the test calls start itself
}

func newChainRig(t testing.TB, o rigOpts) *chainRig {
	t.Helper()
	if o.nvmeBytes == 0 {
		o.nvmeBytes = nvme.MinCapacity
	}
	h, err := NewHost(make([]byte, o.hostBytes), HostConfig{SlabBytes: o.slabBytes})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "nvme")
	store, err := nvme.Open(context.Background(), nvme.Options{
		Dir: dir, CapacityBytes: o.nvmeBytes, Logger: discardLogger(),
		Unevictable: func(k nvme.Key) bool { return k.NS&ParkedNS != 0 },
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.Logger == nil {
		o.cfg.Logger = discardLogger()
	}
	c, err := NewChain(h, store, o.cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.ioHook = o.hook
	r := &chainRig{c: c, h: h, store: store, dir: dir}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	t.Cleanup(func() {
		r.cancel()
		r.c.Wait()
		if err := store.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	if !o.noStart {
		r.start()
	}
	return r
}

func (r *chainRig) start() { r.c.Start(r.ctx) }

// inAny reports whether k is in the host tier or in NVMe.
func (r *chainRig) inAny(k Key) bool { return r.h.Contains(k) || r.store.Contains(nk(k)) }

// chainKey is the i-th key of namespace ns.
func chainKey(ns uint32, i uint64) Key {
	return Key{NS: ns, Hash: shm.Hash{Hi: i*0x9e3779b97f4a7c15 + 7, Lo: i}}
}

// blockFor is the content of k's block: every copy of k, in any tier, must
// hold exactly these bytes.
func blockFor(k Key, size int64) []byte {
	b := make([]byte, size)
	fillFor(b, k)
	return b
}

func fillFor(b []byte, k Key) {
	x := k.Hash.Hi ^ k.Hash.Lo<<1 ^ uint64(k.NS)<<40
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x = splitmix(x)
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < len(b); i++ {
		b[i] = byte(x >> (8 * (i % 8)))
	}
}

// putHost stores k in the host tier the way a session does.
func (r *chainRig) putHost(t testing.TB, k Key, size int64) {
	t.Helper()
	hd, err := r.c.Reserve(k, size)
	if err != nil {
		t.Fatalf("reserve %v: %v", k, err)
	}
	fillFor(r.h.Bytes(hd), k)
	if err := r.h.Commit(hd); err != nil {
		t.Fatal(err)
	}
	if k.Parked() {
		r.c.Park(k)
	} else {
		r.c.Inserted(k, policy.AccessInfo{})
	}
	r.c.Committed()
}

// putNVMe stores k in the NVMe tier only.
func (r *chainRig) putNVMe(t testing.TB, k Key, size int64) {
	t.Helper()
	if err := r.store.Put(nk(k), blockFor(k, size)); err != nil {
		t.Fatalf("nvme put %v: %v", k, err)
	}
}

// checkHostBytes leases k in the host tier and compares its bytes.
func (r *chainRig) checkHostBytes(t testing.TB, k Key, size int64) {
	t.Helper()
	hd, ok := r.h.Acquire(k)
	if !ok {
		t.Fatalf("%v not in the host tier", k)
	}
	defer r.h.Release(hd)
	if !bytes.Equal(r.h.Bytes(hd), blockFor(k, size)) {
		t.Fatalf("%v: host copy differs", k)
	}
}

// checkNVMeBytes reads k from the store and compares its bytes.
func (r *chainRig) checkNVMeBytes(t testing.TB, k Key, size int64) {
	t.Helper()
	dst := make([]byte, size)
	n, err := r.store.Get(nk(k), dst)
	if err != nil || int64(n) != size {
		t.Fatalf("nvme get %v: %d bytes, %v", k, n, err)
	}
	if !bytes.Equal(dst, blockFor(k, size)) {
		t.Fatalf("%v: nvme copy differs", k)
	}
}

func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// acquireWait runs Chain.Acquire and, for a block that must come up from
// NVMe, waits for the mover's callback.
func acquireWait(t testing.TB, c *Chain, k Key, size int64) (*Handle, error) {
	t.Helper()
	type res struct {
		hd  *Handle
		err error
	}
	ch := make(chan res, 1)
	hd, ok := c.Acquire(k, size, func(hd *Handle, err error) { ch <- res{hd, err} })
	switch {
	case !ok:
		return nil, ErrPromote
	case hd != nil:
		return hd, nil
	}
	select {
	case r := <-ch:
		return r.hd, r.err
	case <-time.After(10 * time.Second):
		t.Fatalf("promotion of %v did not complete", k)
		return nil, nil
	}
}

// TestChainDemotesToLowWatermark: above the high watermark the mover
// demotes the coldest blocks to NVMe until the host tier is at the low
// watermark (not much below: it works in batches), and every demoted block
// reads back byte-exact from NVMe.
func TestChainDemotesToLowWatermark(t *testing.T) {
	const bs, n = 256 << 10, 56 // 64 slots; 56 blocks = 87.5% > high
	r := newChainRig(t, rigOpts{hostBytes: 16 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{HighWatermark: 0.75, LowWatermark: 0.5, Policy: "lru"}})
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = chainKey(1, uint64(i))
		r.putHost(t, keys[i], bs)
	}
	_, capacity := r.h.Usage()
	r.start()
	low := int64(0.5 * float64(capacity))
	eventually(t, 10*time.Second, "host tier not demoted to its low watermark", func() bool {
		used, _ := r.h.Usage()
		return used <= low
	})
	time.Sleep(250 * time.Millisecond) // the demoter's tick: it must now stay idle
	used, _ := r.h.Usage()
	if used > low || used < low-16*bs {
		t.Fatalf("host tier at %d bytes, want within one batch below the low watermark %d", used, low)
	}
	st := r.c.Stats()
	left := int(used / bs)
	if st.Demoted != uint64(n-left) || st.DemoteErrors != 0 {
		t.Fatalf("demoted %d (errors %d), want %d", st.Demoted, st.DemoteErrors, n-left)
	}
	for i, k := range keys {
		inHost, inNVMe := r.h.Contains(k), r.store.Contains(nk(k))
		// LRU: the n-left oldest blocks went down, the newest stayed.
		if wantHost := i >= n-left; inHost != wantHost || inNVMe == wantHost {
			t.Fatalf("block %d: host %v nvme %v, want host %v", i, inHost, inNVMe, wantHost)
		}
		if inNVMe {
			r.checkNVMeBytes(t, k, bs)
		} else {
			r.checkHostBytes(t, k, bs)
		}
	}
	var tiers [n]shm.Tier
	if hits, _ := r.c.Lookup(keys, tiers[:]); hits != n {
		t.Fatalf("lookup after demotion: %d of %d", hits, n)
	}
}

// TestChainPromoteOnAcquire: Acquire of a block that is only in NVMe
// answers "later" and hands every waiter a pinned handle once the mover has
// copied the block up; the bytes are exact and the handle is leased.
func TestChainPromoteOnAcquire(t *testing.T) {
	const bs = 256 << 10
	gate := make(chan struct{})
	var gets sync.WaitGroup
	gets.Add(1)
	var once sync.Once
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20,
		hook: func(op string, k Key) {
			if op == "get" {
				once.Do(func() { gets.Done(); <-gate }) // hold the first read
			}
		}})
	k := chainKey(2, 1)
	r.putNVMe(t, k, bs)

	type res struct {
		hd  *Handle
		err error
	}
	ch := make(chan res, 2)
	for i := 0; i < 2; i++ {
		hd, ok := r.c.Acquire(k, bs, func(hd *Handle, err error) { ch <- res{hd, err} })
		if hd != nil || !ok {
			t.Fatalf("acquire %d of an nvme-only block: %v %v, want (nil, true)", i, hd, ok)
		}
	}
	gets.Wait() // the copy is under way; both acquires wait on it
	close(gate)
	for i := 0; i < 2; i++ {
		var x res
		select {
		case x = <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("promotion callback not called")
		}
		if x.err != nil {
			t.Fatalf("waiter %d: %v", i, x.err)
		}
		if !bytes.Equal(r.h.Bytes(x.hd), blockFor(k, bs)) {
			t.Fatalf("waiter %d: promoted bytes differ", i)
		}
		defer r.h.Release(x.hd)
	}
	if hs := r.h.Stats(); hs.Leased != 1 || hs.Blocks != 1 {
		t.Fatalf("after promotion: %d leased, %d blocks; want the block leased", hs.Leased, hs.Blocks)
	}
	// Leased: never demoted, even when the mover is told to make room.
	r.c.makeRoom(8<<20, 1)
	if !r.h.Contains(k) {
		t.Fatal("leased block left the host tier")
	}
	st := r.c.Stats()
	if st.Promoted != 1 || st.PromotedBytes != bs || st.NVMeHits != 2 {
		t.Fatalf("stats %+v: want 1 promotion of %d bytes and 2 nvme hits", st, bs)
	}
	// The NVMe copy stays (clean copy below); a second Acquire is a host hit.
	if !r.store.Contains(nk(k)) {
		t.Fatal("promotion dropped the nvme copy")
	}
	if hd, ok := r.c.Acquire(k, bs, nil); !ok || hd == nil {
		t.Fatalf("acquire after promotion: %v %v, want a host hit", hd, ok)
	} else {
		r.h.Release(hd)
	}
	// A miss in both tiers.
	if hd, ok := r.c.Acquire(chainKey(2, 99), bs, nil); ok || hd != nil {
		t.Fatalf("acquire of an absent block: %v %v", hd, ok)
	}
	if r.c.Stats().NVMeMisses != 1 {
		t.Fatalf("nvme misses %d, want 1", r.c.Stats().NVMeMisses)
	}
}

// TestChainPromoteFailure: a block whose NVMe copy is not what the index
// promised (here: shorter) is a failed promotion (ErrPromote, counted),
// never a host block with wrong bytes.
func TestChainPromoteFailure(t *testing.T) {
	const bs = 64 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20})
	k := chainKey(3, 1)
	// A block whose index entry says bs bytes but whose stored copy is
	// shorter: the promotion's read returns fewer bytes than expected.
	if err := r.store.Put(nk(k), blockFor(k, bs/2)); err != nil {
		t.Fatal(err)
	}
	hd, err := acquireWait(t, r.c, k, bs)
	if err == nil {
		r.h.Release(hd)
		t.Fatal("promotion of a short block succeeded")
	}
	if !errors.Is(err, ErrPromote) {
		t.Fatalf("err %v, want ErrPromote", err)
	}
	if r.h.Contains(k) || r.c.Stats().PromoteErrors != 1 {
		t.Fatalf("failed promotion left a host block or was not counted: %+v", r.c.Stats())
	}
}

// TestChainLookupPrefetch: Lookup reports NVMe-resident blocks as hits in
// the NVMe tier and queues them for promotion; they arrive in the host tier
// without any Acquire.
func TestChainLookupPrefetch(t *testing.T) {
	const bs = 256 << 10
	r := newChainRig(t, rigOpts{hostBytes: 16 << 20, slabBytes: 1 << 20})
	keys := make([]Key, 6)
	for i := range keys {
		keys[i] = chainKey(4, uint64(i))
	}
	r.putHost(t, keys[0], bs)
	r.putHost(t, keys[1], bs)
	for _, k := range keys[2:5] {
		r.putNVMe(t, k, bs)
	}
	// keys[5] is nowhere.
	tiers := make([]shm.Tier, len(keys))
	hits, _ := r.c.Lookup(keys, tiers)
	want := []shm.Tier{shm.TierHost, shm.TierHost, shm.TierNVMe, shm.TierNVMe, shm.TierNVMe, shm.TierNone}
	if hits != 5 || !slices.Equal(tiers, want) {
		t.Fatalf("lookup: %d hits, tiers %v; want 5, %v", hits, tiers, want)
	}
	eventually(t, 10*time.Second, "prefetched blocks did not reach the host tier", func() bool {
		return r.h.Contains(keys[2]) && r.h.Contains(keys[3]) && r.h.Contains(keys[4])
	})
	for _, k := range keys[:5] {
		r.checkHostBytes(t, k, bs)
	}
	st := r.c.Stats()
	if st.Prefetches != 3 || st.Promoted != 3 || st.NVMeHits != 0 {
		t.Fatalf("stats %+v: want 3 prefetches, 3 promotions, no demand hits", st)
	}
	// Lookup stops at the first block missing in every tier.
	hits, _ = r.c.Lookup([]Key{keys[0], keys[5], keys[1]}, tiers[:3])
	if hits != 1 {
		t.Fatalf("lookup across a gap: %d hits, want 1", hits)
	}
}

// TestChainDeleteAcrossTiers: Delete and DeleteNS remove a block from every
// tier it is in.
func TestChainDeleteAcrossTiers(t *testing.T) {
	const bs = 64 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20})
	hostOnly, nvmeOnly, both := chainKey(5, 1), chainKey(5, 2), chainKey(5, 3)
	r.putHost(t, hostOnly, bs)
	r.putNVMe(t, nvmeOnly, bs)
	r.putHost(t, both, bs)
	r.putNVMe(t, both, bs)
	if _, err := r.c.Reserve(nvmeOnly, bs); !errors.Is(err, ErrExists) {
		t.Fatalf("reserve of an nvme block: %v, want ErrExists", err)
	}
	for _, k := range []Key{hostOnly, nvmeOnly, both} {
		if !r.inAny(k) {
			t.Fatalf("%v should exist", k)
		}
		if !r.c.Delete(k) {
			t.Fatalf("delete %v: not found", k)
		}
		if r.h.Contains(k) || r.store.Contains(nk(k)) || r.inAny(k) {
			t.Fatalf("%v survived Delete", k)
		}
		if r.c.Delete(k) {
			t.Fatalf("second delete of %v found it", k)
		}
	}
	// DeleteNS: 3 in host, 3 in nvme, 2 of them in both; another namespace stays.
	for i := uint64(10); i < 13; i++ {
		r.putHost(t, chainKey(6, i), bs)
	}
	for i := uint64(11); i < 14; i++ {
		r.putNVMe(t, chainKey(6, i), bs)
	}
	other := chainKey(7, 1)
	r.putHost(t, other, bs)
	r.putNVMe(t, other, bs)
	if n := r.c.DeleteNS(6); n != 4 {
		t.Fatalf("DeleteNS removed %d distinct blocks as counted, want 4", n)
	}
	for i := uint64(10); i < 14; i++ {
		if k := chainKey(6, i); r.inAny(k) {
			t.Fatalf("%v survived DeleteNS", k)
		}
	}
	if !r.h.Contains(other) || !r.store.Contains(nk(other)) {
		t.Fatal("DeleteNS removed another namespace's block")
	}
}

// TestChainParkExpiry: a parked block is written through to NVMe and leaves
// host memory; it stays until its TTL, then it is deleted from every tier.
// A parked block deleted before its TTL (resumed) is gone at once.
func TestChainParkExpiry(t *testing.T) {
	const bs = 64 << 10
	const ttl = 300 * time.Millisecond
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, cfg: ChainConfig{ParkTTL: ttl}})
	parked := Key{NS: 8 | ParkedNS, Hash: shm.Hash{Hi: 4242, Lo: 0}}
	resumed := Key{NS: 8 | ParkedNS, Hash: shm.Hash{Hi: 4242, Lo: 1}}
	t0 := time.Now()
	r.putHost(t, parked, bs)
	r.putHost(t, resumed, bs)
	if !parked.Parked() || r.c.ParkedBlocks() != 2 {
		t.Fatalf("parked blocks %d, want 2", r.c.ParkedBlocks())
	}
	eventually(t, 5*time.Second, "parked blocks not swapped out", func() bool {
		return !r.h.Contains(parked) && !r.h.Contains(resumed) &&
			r.store.Contains(nk(parked)) && r.store.Contains(nk(resumed))
	})
	if time.Since(t0) < ttl {
		r.checkNVMeBytes(t, parked, bs)
		if r.c.ParkedBlocks() != 2 {
			t.Fatalf("parked blocks %d before the TTL, want 2", r.c.ParkedBlocks())
		}
	}
	hd, err := acquireWait(t, r.c, resumed, bs) // resume: bring it up, then release it
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.h.Bytes(hd), blockFor(resumed, bs)) {
		t.Fatal("resumed block differs")
	}
	r.h.Release(hd)
	r.c.Delete(resumed)
	if r.c.ParkedBlocks() != 1 || r.inAny(resumed) {
		t.Fatalf("resumed block still parked (%d) or present", r.c.ParkedBlocks())
	}
	eventually(t, 5*time.Second, "parked block did not expire", func() bool {
		return r.c.ParkedBlocks() == 0 && !r.inAny(parked)
	})
	if waited := time.Since(t0); waited < ttl {
		t.Fatalf("expired after %v, before the TTL %v", waited, ttl)
	}
	if st := r.c.Stats(); st.ParkExpired != 1 || st.ParkErrors != 0 {
		t.Fatalf("stats %+v: want 1 expiry, no errors", st)
	}
}

// TestChainFlush: Flush writes every host block without an NVMe copy down
// and keeps the host copies; a second Flush has nothing to do.
func TestChainFlush(t *testing.T) {
	const bs, n = 128 << 10, 20
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20})
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = chainKey(9, uint64(i))
		r.putHost(t, keys[i], bs)
	}
	r.putNVMe(t, keys[0], bs) // already has a clean copy below
	ctx := context.Background()
	if got, err := r.c.Flush(ctx); err != nil || got != n-1 {
		t.Fatalf("flush wrote %d (%v), want %d", got, err, n-1)
	}
	for _, k := range keys {
		if !r.h.Contains(k) {
			t.Fatalf("%v left the host tier on flush", k)
		}
		r.checkNVMeBytes(t, k, bs)
	}
	if hs := r.h.Stats(); hs.Leased != 0 {
		t.Fatalf("flush left %d blocks pinned", hs.Leased)
	}
	if got, err := r.c.Flush(ctx); err != nil || got != 0 {
		t.Fatalf("second flush wrote %d (%v), want 0", got, err)
	}
	r.putHost(t, chainKey(9, 100), bs)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if got, err := r.c.Flush(cctx); !errors.Is(err, context.Canceled) || got != 0 {
		t.Fatalf("flush with a cancelled context: %d %v", got, err)
	}
	if hs := r.h.Stats(); hs.Leased != 0 {
		t.Fatalf("cancelled flush left %d blocks pinned", hs.Leased)
	}
}

// slowPuts is an I/O hook that makes every NVMe write take 20 ms and keeps
// in most the largest number of writes seen in flight at once.
func slowPuts(most *atomic.Int32) func(op string, k Key) {
	var inFlight atomic.Int32
	return func(op string, k Key) {
		if op != "put" {
			return
		}
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond) // a slow disk: writes overlap if they can
		inFlight.Add(-1)
	}
}

// TestPromotionDuringDemotionPass: a promotion that must make room waits
// for the demoter's current batch, not for its whole pass down to the low
// watermark: on a slow disk it completes while the pass is still under way.
func TestPromotionDuringDemotionPass(t *testing.T) {
	const bs = 256 << 10
	var most atomic.Int32
	r := newChainRig(t, rigOpts{hostBytes: 32 << 20, slabBytes: 1 << 20, nvmeBytes: 256 << 20, noStart: true,
		cfg:  ChainConfig{HighWatermark: 0.75, LowWatermark: 0.5},
		hook: slowPuts(&most)})
	for i := range 120 { // of 128 slots: a pass of 56 blocks, 4 batches
		r.putHost(t, chainKey(14, uint64(i)), bs)
	}
	cold := chainKey(14, 1000)
	r.putNVMe(t, cold, bs)
	r.start()
	eventually(t, 10*time.Second, "no demotion started", func() bool { return most.Load() > 0 })
	_, capacity := r.h.Usage()
	type res struct {
		hd   *Handle
		err  error
		used int64
	}
	done := make(chan res, 1)
	if hd, ok := r.c.Acquire(cold, bs, func(hd *Handle, err error) {
		used, _ := r.h.Usage()
		done <- res{hd, err, used}
	}); hd != nil || !ok {
		t.Fatalf("acquire of the nvme block: %v %v", hd, ok)
	}
	var got res
	select {
	case got = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("promotion did not finish")
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	if !bytes.Equal(r.h.Bytes(got.hd), blockFor(cold, bs)) {
		t.Fatal("promoted block differs")
	}
	r.h.Release(got.hd)
	if low := capacity / 2; got.used <= low+bs {
		t.Fatalf("promotion finished with %d of %d bytes used: after the demotion pass (low watermark %d)", got.used, capacity, low)
	}
}

// TestPromotionWithRoomDoesNotWait: a promotion whose block fits under the
// high watermark goes ahead while the demoter's batch is still being
// written, instead of waiting for the batch to end.
func TestPromotionWithRoomDoesNotWait(t *testing.T) {
	const bs = 256 << 10
	var demotedAtRead atomic.Int64
	demotedAtRead.Store(-1)
	var r *chainRig
	slow := slowPuts(new(atomic.Int32))
	r = newChainRig(t, rigOpts{hostBytes: 32 << 20, slabBytes: 1 << 20, nvmeBytes: 256 << 20, noStart: true,
		cfg: ChainConfig{HighWatermark: 0.75, LowWatermark: 0.5},
		hook: func(op string, k Key) {
			if op == "get" {
				demotedAtRead.Store(int64(r.c.Stats().Demoted))
			}
			slow(op, k)
		}})
	for i := range 100 { // of 128 slots, high watermark 96, low 64: batches of 16, 16 and 4 blocks, 20 ms each
		r.putHost(t, chainKey(15, uint64(i)), bs)
	}
	cold := chainKey(15, 1000)
	r.putNVMe(t, cold, bs)
	r.start()
	// Blocks leave the host tier a writer's run at a time. Once the first
	// batch is down the block fits under the high watermark, and the
	// second batch has 16 blocks, at least 160 ms, to write.
	eventually(t, 10*time.Second, "the first batch did not go down", func() bool { return r.c.Stats().Demoted >= 16 })
	hd, err := acquireWait(t, r.c, cold, bs)
	if err != nil {
		t.Fatal(err)
	}
	r.h.Release(hd)
	if got := demotedAtRead.Load(); got < 0 || got >= 32 {
		t.Fatalf("the promotion read NVMe after %d demotions: it waited for the demoter's second batch", got)
	}
}

// TestParkWritesInParallel: a parked request's blocks are written through
// by up to demoteWriters writers at once, and each leaves the host tier
// intact in NVMe.
func TestParkWritesInParallel(t *testing.T) {
	if demoteWriters() < 2 {
		t.Skipf("GOMAXPROCS=%d: parked blocks are written one at a time", runtime.GOMAXPROCS(0))
	}
	const bs = 256 << 10
	var most atomic.Int32
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, hook: slowPuts(&most)})
	keys := make([]Key, 12)
	for i := range keys {
		keys[i] = Key{NS: 13 | ParkedNS, Hash: shm.Hash{Hi: 99, Lo: uint64(i)}}
		r.putHost(t, keys[i], bs)
	}
	eventually(t, 10*time.Second, "parked blocks not swapped out", func() bool { return r.h.Stats().Blocks == 0 })
	if got, want := most.Load(), int32(demoteWriters()); got != want {
		t.Errorf("at most %d NVMe writes in flight, want %d", got, want)
	}
	for _, k := range keys {
		r.checkNVMeBytes(t, k, bs)
	}
}

// TestDemotionWritesInParallel: a demotion pass keeps up to demoteWriters
// NVMe writes in flight (one writer left the disk idle while it hashed and
// indexed), never more, and every block it moves lands intact.
func TestDemotionWritesInParallel(t *testing.T) {
	if demoteWriters() < 2 {
		t.Skipf("GOMAXPROCS=%d: demotion writes one block at a time", runtime.GOMAXPROCS(0))
	}
	const bs = 256 << 10
	var most atomic.Int32
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true,
		cfg:  ChainConfig{HighWatermark: 0.75, LowWatermark: 0.5},
		hook: slowPuts(&most)})
	keys := make([]Key, 30) // of 32 slots: 14 go down to reach the low watermark
	for i := range keys {
		keys[i] = chainKey(11, uint64(i))
		r.putHost(t, keys[i], bs)
	}
	r.start()
	deadline := time.Now().Add(10 * time.Second)
	for {
		used, capacity := r.h.Usage()
		if used <= capacity/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("demoter did not reach the low watermark: %d of %d bytes used", used, capacity)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got, want := most.Load(), int32(demoteWriters()); got != want {
		t.Errorf("at most %d NVMe writes in flight, want %d", got, want)
	}
	moved := 0
	for _, k := range keys {
		if r.h.Contains(k) {
			continue
		}
		moved++
		r.checkNVMeBytes(t, k, bs)
	}
	if moved < 14 {
		t.Fatalf("%d blocks left the host tier, want at least 14", moved)
	}
}

// TestDemotionWritesBatched: a demotion pass hands each writer's run of
// blocks to the store in one batched call, which writes small blocks with
// one segment write per run instead of one per block, and every block
// lands intact.
func TestDemotionWritesBatched(t *testing.T) {
	const bs = 64 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{HighWatermark: 0.75, LowWatermark: 0.5}})
	keys := make([]Key, 120) // of 128 slots: 56 go down to reach the low watermark
	for i := range keys {
		keys[i] = chainKey(12, uint64(i))
		r.putHost(t, keys[i], bs)
	}
	r.start()
	eventually(t, 10*time.Second, "demoter did not reach the low watermark", func() bool {
		used, capacity := r.h.Usage()
		return used <= capacity/2
	})
	moved := 0
	for _, k := range keys {
		if !r.h.Contains(k) {
			moved++
			r.checkNVMeBytes(t, k, bs)
		}
	}
	writes := r.store.Stats().SegmentWrites
	if moved < 56 || writes*4 > uint64(moved) {
		t.Fatalf("%d blocks went down in %d segment writes, want at least 56 in a quarter as many writes", moved, writes)
	}
}

// TestParkWritesBatched: the blocks of a parked request waiting to be
// written through go down in batches (one segment write for several
// blocks), each intact.
func TestParkWritesBatched(t *testing.T) {
	const bs = 64 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true})
	keys := make([]Key, 64)
	for i := range keys {
		keys[i] = Key{NS: 14 | ParkedNS, Hash: shm.Hash{Hi: 98, Lo: uint64(i)}}
		r.putHost(t, keys[i], bs) // queued for the park writers, which start below
	}
	r.start()
	eventually(t, 10*time.Second, "parked blocks not swapped out", func() bool { return r.h.Stats().Blocks == 0 })
	for _, k := range keys {
		r.checkNVMeBytes(t, k, bs)
	}
	if w := r.store.Stats().SegmentWrites; w*4 > uint64(len(keys)) {
		t.Fatalf("%d parked blocks written in %d segment writes, want at most a quarter as many", len(keys), w)
	}
}

// TestPromotionReadsBatched: a looked-up prefix whose blocks went down
// together comes back up with one read per run of back-to-back records
// (nvme GetBatch), each block intact; a demand Acquire of one of them is
// served by the same runs.
func TestPromotionReadsBatched(t *testing.T) {
	const bs = 64 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{PromoteQueue: 64}})
	keys := make([]Key, 48)
	nks := make([]nvme.Key, len(keys))
	blocks := make([][]byte, len(keys))
	for i := range keys {
		keys[i] = chainKey(15, uint64(i))
		nks[i], blocks[i] = nk(keys[i]), blockFor(keys[i], bs)
	}
	if err := r.store.PutBatch(nks, blocks); err != nil { // 3 writes of 16 blocks
		t.Fatal(err)
	}
	reads0 := r.store.Stats().SegmentReads
	// Queue every prefetch before the workers start, as a lookup does
	// while they are busy.
	tiers := make([]shm.Tier, len(keys))
	if hits, _ := r.c.Lookup(keys, tiers); hits != len(keys) {
		t.Fatalf("lookup found %d of %d", hits, len(keys))
	}
	got := make(chan error, 1)
	if _, ok := r.c.Acquire(keys[40], bs, func(hd *Handle, err error) {
		if err == nil {
			r.h.Unpin(hd, false)
		}
		got <- err
	}); !ok {
		t.Fatal("Acquire: miss")
	}
	r.start()
	if err := <-got; err != nil {
		t.Fatalf("demand promotion: %v", err)
	}
	eventually(t, 10*time.Second, "prefix not promoted", func() bool { return r.c.Stats().Promoted == uint64(len(keys)) })
	for _, k := range keys {
		r.checkHostBytes(t, k, bs)
	}
	if reads := r.store.Stats().SegmentReads - reads0; reads*4 > uint64(len(keys)) {
		t.Fatalf("%d blocks promoted with %d segment reads, want at most a quarter as many", len(keys), reads)
	}
}

// TestPromotionRunMakesRoomInOneBatch: a run of promotions into a host
// tier at its high watermark makes its room with one demotion batch (one
// write per writer), not one small batch per 4 blocks.
func TestPromotionRunMakesRoomInOneBatch(t *testing.T) {
	const bs = 64 << 10
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{HighWatermark: 0.75, LowWatermark: 0.5, PromoteWorkers: 1, PromoteQueue: 64}})
	for i := range 96 { // 96 of 128 slots: at the high watermark, so the demoter idles
		r.putHost(t, chainKey(17, uint64(i)), bs)
	}
	keys := make([]Key, 16) // 1 MiB: one promotion run
	nks := make([]nvme.Key, len(keys))
	blocks := make([][]byte, len(keys))
	for i := range keys {
		keys[i] = chainKey(18, uint64(i))
		nks[i], blocks[i] = nk(keys[i]), blockFor(keys[i], bs)
	}
	if err := r.store.PutBatch(nks, blocks); err != nil {
		t.Fatal(err)
	}
	writes0 := r.store.Stats().SegmentWrites
	tiers := make([]shm.Tier, len(keys))
	if hits, _ := r.c.Lookup(keys, tiers); hits != len(keys) {
		t.Fatalf("lookup found %d of %d", hits, len(keys))
	}
	r.start()
	eventually(t, 10*time.Second, "run not promoted", func() bool { return r.c.Stats().Promoted == uint64(len(keys)) })
	for _, k := range keys {
		r.checkHostBytes(t, k, bs)
	}
	st := r.c.Stats()
	writes := r.store.Stats().SegmentWrites - writes0
	if st.Demoted < uint64(len(keys)) || writes > uint64(demoteWriters()) {
		t.Fatalf("%d blocks demoted to make room in %d segment writes; want at least %d in at most %d (one per writer)",
			st.Demoted, writes, len(keys), demoteWriters())
	}
}

// TestChainSlowDiskLookup: with a disk that takes 50 ms per write and
// 500 ms per read, the mover's demotions and a demand promotion are stuck
// on it, while Lookup (and host-tier Acquire) on the caller's goroutine —
// the ring loop in the daemon — stay fast: they consult in-memory indexes
// only and never wait for the mover.
func TestChainSlowDiskLookup(t *testing.T) {
	const bs = 256 << 10
	const slowGet, slowPut = 500 * time.Millisecond, 50 * time.Millisecond
	var inGet sync.Once
	getStarted := make(chan struct{})
	r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, noStart: true,
		cfg: ChainConfig{HighWatermark: 0.75, LowWatermark: 0.5},
		hook: func(op string, k Key) {
			switch op {
			case "get":
				inGet.Do(func() { close(getStarted) })
				time.Sleep(slowGet)
			case "put":
				time.Sleep(slowPut)
			}
		}})
	// 30 of 32 slots: the demoter must write 14 blocks at 50 ms each.
	keys := make([]Key, 30)
	for i := range keys {
		keys[i] = chainKey(10, uint64(i))
		r.putHost(t, keys[i], bs)
	}
	cold := chainKey(10, 1000)
	r.putNVMe(t, cold, bs)
	r.start()

	done := make(chan error, 1)
	var got *Handle
	t0 := time.Now()
	if hd, ok := r.c.Acquire(cold, bs, func(hd *Handle, err error) { got = hd; done <- err }); hd != nil || !ok {
		t.Fatalf("acquire of the nvme block: %v %v", hd, ok)
	}
	lookupChain := append(append([]Key{}, keys...), cold)
	tiers := make([]shm.Tier, len(lookupChain))
	var lookups, acquires []time.Duration
	sawGet := false
	for finished := false; !finished; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("promotion: %v", err)
			}
			finished = true
		case <-getStarted:
			sawGet, getStarted = true, nil
		default:
		}
		l0 := time.Now()
		r.c.Lookup(lookupChain, tiers)
		lookups = append(lookups, time.Since(l0))
		// A host hit on the same "ring loop".
		a0 := time.Now()
		if hd, ok := r.c.Acquire(keys[len(keys)-1], bs, nil); ok && hd != nil {
			r.h.Release(hd)
		}
		acquires = append(acquires, time.Since(a0))
		time.Sleep(200 * time.Microsecond)
		if time.Since(t0) > 20*time.Second {
			t.Fatal("promotion never finished")
		}
	}
	promo := time.Since(t0)
	defer r.h.Release(got)
	if !bytes.Equal(r.h.Bytes(got), blockFor(cold, bs)) {
		t.Fatal("promoted bytes differ")
	}
	if !sawGet || promo < slowGet {
		t.Fatalf("the promotion took %v (read started: %v): the slow disk was not in its way", promo, sawGet)
	}
	p50, p99, pmax := percentiles(lookups)
	a50, a99, amax := percentiles(acquires)
	t.Logf("promotion stuck %v; %d lookups p50 %v p99 %v max %v; host acquires p50 %v p99 %v max %v; demoted %d",
		promo.Round(time.Millisecond), len(lookups), p50, p99, pmax, a50, a99, amax, r.c.Stats().Demoted)
	if p99 > 10*time.Millisecond || pmax > 100*time.Millisecond {
		t.Fatalf("lookup p99 %v max %v while the disk is slow: want p99 < 10ms", p99, pmax)
	}
	if a99 > 10*time.Millisecond {
		t.Fatalf("host acquire p99 %v while the disk is slow", a99)
	}
	if r.c.Stats().Demoted == 0 {
		t.Fatal("the demoter never ran: the test did not exercise a busy mover")
	}
}

// percentiles returns p50, p99 and the maximum of ds (sorted in place).
func percentiles(ds []time.Duration) (p50, p99, pmax time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1]
}

// dropPageCache writes back and drops the page cache of every file in dir,
// so the next reads come from the device.
func dropPageCache(tb testing.TB, dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		_ = f.Sync()
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
	}
}

// BenchmarkPromote measures promotion latency NVMe → host for 2 MiB
// blocks: from Acquire of a block that is only in NVMe to the callback
// with the leased host copy (queueing, host slot, read + XXH3-128
// verification, commit). "cold" drops the store's page cache before every
// pass over the blocks; "warm" does not. With the segment store's direct
// (O_DIRECT) reads both read the device; they differ only if reads go
// through the page cache. Run with -benchtime=1024x or so: p50/p99 come
// from the per-promotion latencies.
func BenchmarkPromote(b *testing.B) {
	const bs, nblocks = 2 << 20, 128 // 256 MiB on disk
	for _, cold := range []bool{false, true} {
		name := "warm"
		if cold {
			name = "cold"
		}
		b.Run(name, func(b *testing.B) {
			r := newChainRig(b, rigOpts{hostBytes: 64 << 20, slabBytes: 8 << 20, nvmeBytes: 1 << 30})
			keys := make([]Key, nblocks)
			for i := range keys {
				keys[i] = chainKey(11, uint64(i))
				r.putNVMe(b, keys[i], bs)
			}
			lat := make([]time.Duration, 0, b.N)
			type res struct {
				hd  *Handle
				err error
			}
			ch := make(chan res, 1)
			cb := func(hd *Handle, err error) { ch <- res{hd, err} }
			b.SetBytes(bs)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := keys[i%nblocks]
				if cold && i%nblocks == 0 {
					b.StopTimer()
					dropPageCache(b, r.dir)
					b.StartTimer()
				}
				t0 := time.Now()
				if hd, ok := r.c.Acquire(k, bs, cb); hd != nil || !ok {
					b.Fatalf("block %d not nvme-only: %v %v", i, hd, ok)
				}
				x := <-ch
				lat = append(lat, time.Since(t0))
				if x.err != nil {
					b.Fatal(x.err)
				}
				r.h.Release(x.hd)
				r.h.Delete(k) // NVMe-only again for the next pass
			}
			b.StopTimer()
			p50, p99, pmax := percentiles(lat)
			b.ReportMetric(float64(p50.Nanoseconds())/1e3, "p50-us")
			b.ReportMetric(float64(p99.Nanoseconds())/1e3, "p99-us")
			b.ReportMetric(float64(pmax.Nanoseconds())/1e3, "max-us")
			if st := r.c.Stats(); st.Promoted != uint64(b.N) || st.PromoteErrors != 0 {
				b.Fatalf("promoted %d of %d (errors %d)", st.Promoted, b.N, st.PromoteErrors)
			}
		})
	}
}

// BenchmarkPromotePrefix measures how long a looked-up prefix of 64 blocks
// of 64 KiB that is only in NVMe takes to come up: Lookup (which queues
// the prefetches), an Acquire of every block, until the last lease. The
// blocks were written down in runs of 16, as the mover writes them.
// "batched" is the default (a promotion worker takes up to 1 MiB of queued
// blocks and reads back-to-back records with one read); "one-per-read" is
// the same chain promoting one block per read, the baseline of the same
// run. Run with -benchtime=200x or so: p50/p99 are per prefix.
func BenchmarkPromotePrefix(b *testing.B) {
	const bs, prefix, prefixes = 64 << 10, 64, 8
	for _, mode := range []struct {
		name string
		run  int64
	}{{"one-per-read", 1}, {"batched", promoteRunBytes}} {
		b.Run(mode.name, func(b *testing.B) {
			r := newChainRig(b, rigOpts{hostBytes: 64 << 20, slabBytes: 8 << 20, nvmeBytes: 1 << 30, noStart: true,
				cfg: ChainConfig{PromoteQueue: 2 * prefix}})
			r.c.promoteRun = mode.run
			r.start()
			chains := make([][]Key, prefixes)
			for p := range chains {
				chains[p] = make([]Key, prefix)
				for i := range chains[p] {
					chains[p][i] = chainKey(16, uint64(p*prefix+i))
				}
				for i := 0; i < prefix; i += writeRun {
					var nks []nvme.Key
					var blocks [][]byte
					for _, k := range chains[p][i : i+writeRun] {
						nks, blocks = append(nks, nk(k)), append(blocks, blockFor(k, bs))
					}
					if err := r.store.PutBatch(nks, blocks); err != nil {
						b.Fatal(err)
					}
				}
			}
			tiers := make([]shm.Tier, prefix)
			done := make(chan error, prefix)
			cb := func(hd *Handle, err error) {
				if err == nil {
					r.h.Release(hd)
				}
				done <- err
			}
			lat := make([]time.Duration, 0, b.N)
			reads0 := r.store.Stats().SegmentReads
			b.SetBytes(bs * prefix)
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				keys := chains[n%prefixes]
				t0 := time.Now()
				if hits, _ := r.c.Lookup(keys, tiers); hits != prefix {
					b.Fatalf("lookup found %d of %d", hits, prefix)
				}
				for _, k := range keys {
					hd, ok := r.c.Acquire(k, bs, cb)
					if !ok {
						b.Fatal("Acquire: miss")
					}
					if hd != nil { // its prefetch finished first
						r.h.Release(hd)
						done <- nil
					}
				}
				for range keys {
					if err := <-done; err != nil {
						b.Fatal(err)
					}
				}
				lat = append(lat, time.Since(t0))
				b.StopTimer()
				for _, k := range keys {
					r.h.Delete(k) // NVMe-only again for the next pass
				}
				b.StartTimer()
			}
			b.StopTimer()
			p50, p99, _ := percentiles(lat)
			b.ReportMetric(float64(p50.Nanoseconds())/1e6, "p50-ms")
			b.ReportMetric(float64(p99.Nanoseconds())/1e6, "p99-ms")
			b.ReportMetric(float64(b.N*prefix)/float64(r.store.Stats().SegmentReads-reads0), "blocks/read")
		})
	}
}

// BenchmarkIndexMemory measures the Go heap per resident block of the host
// tier's index (1M committed 64-byte blocks: the index map, handles,
// LRU links, per-namespace lists, slab bookkeeping; the arena itself is
// excluded) and of the default replacement policy's state for the same
// blocks (policy structures plus the chain's key set), which the daemon
// keeps beside the index. The NVMe tier's index is measured by
// tiers/nvme's TestReindex1M (-nvme.reindex1m). Run with -benchtime=1x.
func BenchmarkIndexMemory(b *testing.B) {
	const n = 1 << 20
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = chainKey(uint32(1+i%4), uint64(i))
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for i := 0; i < b.N; i++ {
		arena := make([]byte, 64<<20) // 1M slots of 64 B
		h0 := heap()
		h, err := NewHost(arena, HostConfig{SlabBytes: 1 << 20, Align: 64})
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			hd, err := h.Reserve(k, 64)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Commit(hd); err != nil {
				b.Fatal(err)
			}
		}
		hostPer := float64(heap()-h0) / n
		if h.Stats().Blocks != n {
			b.Fatalf("%d blocks resident", h.Stats().Blocks)
		}
		runtime.KeepAlive(h)
		runtime.KeepAlive(arena)
		h, arena = nil, nil

		h0 = heap()
		pol, err := policy.New(policy.Default, n)
		if err != nil {
			b.Fatal(err)
		}
		known := make(map[policy.Key]struct{})
		const chainLen = 64
		for j, k := range keys {
			pos := j % chainLen
			a := policy.AccessInfo{Pos: pos, ChainLen: chainLen, Request: uint64(j / chainLen), TimeMs: int64(j), HasParent: pos > 0}
			if pos > 0 {
				a.Parent = pk(keys[j-1])
			}
			if pol.Admit(pk(k), a) {
				pol.Insert(pk(k), a)
				known[pk(k)] = struct{}{}
			}
		}
		polPer := float64(heap()-h0) / float64(max(len(known), 1))
		if len(known) != n {
			b.Logf("policy admitted %d of %d blocks", len(known), n)
		}
		runtime.KeepAlive(pol)
		runtime.KeepAlive(known)
		b.ReportMetric(hostPer, "host-B/block")
		b.ReportMetric(polPer, "policy-B/block")
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// BenchmarkParkWriteThrough measures the swap-out of a parked request of 64
// MiB: its blocks stored into the host tier under parked keys, until every
// one has been written through to NVMe and has left the host tier (the
// copy into the host tier included). The baseline, in the same run, is one
// goroutine putting blocks of the same size straight into the nvme.Store.
//
//	go test ./tiers -run '^$' -bench ParkWriteThrough -benchtime 20x
func BenchmarkParkWriteThrough(b *testing.B) {
	for _, bs := range []int64{64 << 10, 2 << 20} {
		n := int(64 << 20 / bs)
		keys := func(i int) []Key {
			ks := make([]Key, n)
			for j := range ks {
				ks[j] = Key{NS: 12 | ParkedNS, Hash: shm.Hash{Hi: uint64(i), Lo: uint64(j)}}
			}
			return ks
		}
		b.Run(fmt.Sprintf("park/%dKiB", bs>>10), func(b *testing.B) {
			r := newChainRig(b, rigOpts{hostBytes: 256 << 20, slabBytes: 8 << 20, nvmeBytes: 1 << 30})
			b.SetBytes(int64(n) * bs)
			for i := range b.N {
				ks := keys(i)
				for _, k := range ks {
					r.putHost(b, k, bs)
				}
				eventually(b, time.Minute, "parked request not swapped out", func() bool {
					return r.h.Stats().Blocks == 0
				})
				b.StopTimer()
				for _, k := range ks {
					if !r.store.Contains(nk(k)) {
						b.Fatalf("%v not in NVMe", k)
					}
					r.c.Delete(k)
				}
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("put-baseline/%dKiB", bs>>10), func(b *testing.B) {
			r := newChainRig(b, rigOpts{hostBytes: 256 << 20, slabBytes: 8 << 20, nvmeBytes: 1 << 30, noStart: true})
			b.SetBytes(int64(n) * bs)
			buf := blockFor(Key{}, bs) // the same bytes under every key: no fill in the timing
			for i := range b.N {
				ks := keys(i)
				for _, k := range ks {
					if err := r.store.Put(nk(k), buf); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				for _, k := range ks {
					r.store.Delete(nk(k))
				}
				b.StartTimer()
			}
		})
	}
}
