package itest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
	"github.com/kvtier/kvtier/shm"
)

// TestSmokeInProcess: the basic path against an in-process daemon, and the
// ring round-trip cost for the log.
func TestSmokeInProcess(t *testing.T) {
	t.Parallel()
	ip := startInProc(t, "64MiB", 16<<20, nil)
	c := dial(t, ip.cfg.Socket)
	s := open(t, c, testNS("m", 1<<20))
	ctx := context.Background()
	hs := chain(1, 4)
	blk := payload(hs[0], 1<<20)
	if ok, err := s.Put(ctx, hs[0], blk); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := s.Put(ctx, hs[0], blk); err != nil || ok {
		t.Fatal("dup", ok, err)
	}
	r, err := s.Lookup(ctx, hs)
	if err != nil || r.Hits != 1 || r.Tiers[0] != client.TierHost {
		t.Fatal(r, err)
	}
	dst := make([]byte, 1<<20)
	if err := s.Get(ctx, hs[0], dst); err != nil || !bytes.Equal(dst, blk) {
		t.Fatal(err)
	}
	if err := s.Get(ctx, hs[1], dst); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get of a missing block: %v", err)
	}
	t0 := time.Now()
	for i := 0; i < 1000; i++ {
		if err := s.Nop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("nop round trip avg %v (race detector on)", time.Since(t0)/1000)
	st := stats(t, c)
	if st.Tiers[0].Blocks != 1 || st.Tiers[0].Hits < 1 || st.Ops["nop"] != 1000 {
		t.Fatalf("stats: %+v ops %v", st.Tiers[0], st.Ops)
	}
}

// TestConcurrentMixed: 8 goroutines share one session while 4 more sessions
// run 2 goroutines each, all doing put/get/lookup/delete/reserve+abort on a
// shared key space under eviction pressure. Every byte read is verified.
func TestConcurrentMixed(t *testing.T) {
	t.Parallel()
	const bs = 64 << 10
	// 16 MiB / 64 KiB = 256 slots for 384 keys: evictions happen.
	ip := startInProc(t, "16MiB", 1<<20, nil)
	c := dial(t, ip.cfg.Socket)
	ns := testNS("itest", bs)
	shared := open(t, c, ns)
	sessions := []*client.Session{shared, shared, shared, shared, shared, shared, shared, shared}
	for i := 0; i < 4; i++ {
		s := open(t, c, ns)
		sessions = append(sessions, s, s)
	}
	keys := chain(500, 384)
	blocks := make(map[client.Hash][]byte, len(keys))
	for _, h := range keys {
		blocks[h] = payload(h, bs)
	}

	var ops, hits, puts atomic.Int64
	ctx := context.Background()
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	errc := make(chan error, len(sessions))
	for g, s := range sessions {
		wg.Add(1)
		go func(g int, s *client.Session) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			dst := make([]byte, bs)
			dsts := [][]byte{make([]byte, bs), make([]byte, bs), make([]byte, bs)}
			fail := func(format string, args ...any) {
				errc <- fmt.Errorf("goroutine %d: "+format, append([]any{g}, args...)...)
			}
			for time.Now().Before(deadline) {
				i := rng.IntN(len(keys) - 3)
				h := keys[i]
				ops.Add(1)
				switch op := rng.IntN(10); op {
				case 0, 1, 2:
					if _, err := s.Put(ctx, h, blocks[h]); err != nil && !errors.Is(err, client.ErrFull) {
						fail("put: %v", err)
						return
					}
					puts.Add(1)
				case 3, 4:
					err := s.Get(ctx, h, dst)
					if errors.Is(err, client.ErrNotFound) {
						continue
					}
					if err != nil {
						fail("get: %v", err)
						return
					}
					if !bytes.Equal(dst, blocks[h]) {
						fail("get %d: bytes differ", i)
						return
					}
					hits.Add(1)
				case 5:
					found, err := s.GetBatch(ctx, keys[i:i+3], dsts)
					if err != nil {
						fail("get batch: %v", err)
						return
					}
					for j := range found {
						if found[j] && !bytes.Equal(dsts[j], blocks[keys[i+j]]) {
							fail("get batch %d: bytes differ", i+j)
							return
						}
					}
				case 6, 7:
					r, err := s.Lookup(ctx, keys[i:i+3])
					if err != nil {
						fail("lookup: %v", err)
						return
					}
					if r.Hits > 3 || len(r.Tiers) != r.Hits {
						fail("lookup: %+v", r)
						return
					}
					for _, tier := range r.Tiers {
						if tier != client.TierHost {
							fail("lookup tier %v", tier)
							return
						}
					}
				case 8:
					if _, err := s.Delete(ctx, h); err != nil {
						fail("delete: %v", err)
						return
					}
				case 9:
					// Zero-copy read held across other goroutines' work.
					l, err := s.Acquire(ctx, h)
					if errors.Is(err, client.ErrNotFound) {
						continue
					}
					if err != nil {
						fail("acquire: %v", err)
						return
					}
					ok := bytes.Equal(l.Bytes(), blocks[h])
					if err := l.Release(); err != nil {
						fail("release: %v", err)
						return
					}
					if !ok {
						fail("lease %d: bytes differ", i)
						return
					}
				}
			}
		}(g, s)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	t.Logf("%d ops (%d puts, %d verified gets) on %d goroutines", ops.Load(), puts.Load(), hits.Load(), len(sessions))
	if hits.Load() == 0 || puts.Load() == 0 {
		t.Fatal("no verified traffic")
	}
	st, _, ok := waitStats(t, c, 2*time.Second, func(st *client.Stats) bool {
		return st.Tiers[0].Reserved == 0 && st.Tiers[0].Leased == 0
	})
	if !ok {
		t.Fatalf("leftover reservations/leases: %+v", st.Tiers[0])
	}
	if st.SessionsBad != 0 || st.Sessions != 5 {
		t.Fatalf("sessions %d, hostile %d", st.Sessions, st.SessionsBad)
	}
	t.Logf("tier: %d blocks, %d evictions, hit ratio %.2f", st.Tiers[0].Blocks, st.Tiers[0].Evictions, st.Tiers[0].HitRatio)
}

// TestContextCancel: calls whose context ends while they are in flight
// return ctx.Err() and leave no reservation or lease behind, whatever point
// of the call the cancellation hits.
func TestContextCancel(t *testing.T) {
	t.Parallel()
	const bs = 16 << 10
	ip := startInProc(t, "64MiB", 4<<20, nil)
	c := dial(t, ip.cfg.Socket)
	s := open(t, c, testNS("itest", bs))
	ctx := context.Background()
	cached := chain(600, 64)
	blocks := make([][]byte, len(cached))
	for i, h := range cached {
		blocks[i] = payload(h, bs)
	}
	if n, err := s.PutBatch(ctx, cached, blocks); err != nil || n != len(cached) {
		t.Fatal(n, err)
	}
	fresh := chain(601, 300) // reserved and aborted, never committed
	dsts := make([][]byte, len(cached))
	for i := range dsts {
		dsts[i] = make([]byte, bs)
	}
	long := append(append([]client.Hash{}, cached...), fresh...)

	var cancelled, completed int
	for iter := 0; iter < 300; iter++ {
		cctx, cancel := context.WithCancel(ctx)
		if iter%10 == 0 {
			cancel() // before the call
		} else {
			time.AfterFunc(time.Duration(rand.IntN(400))*time.Microsecond, cancel)
		}
		var err error
		switch iter % 5 {
		case 0:
			var rs []*client.Reservation
			if rs, err = s.ReserveBatch(cctx, fresh); err == nil {
				err = s.AbortBatch(ctx, rs)
			}
		case 1:
			var ls []*client.Lease
			if ls, err = s.AcquireBatch(cctx, cached); err == nil {
				for i, l := range ls {
					if l == nil || !bytes.Equal(l.Bytes(), blocks[i]) {
						t.Fatalf("lease %d wrong", i)
					}
				}
				err = s.ReleaseBatch(ls)
			}
		case 2:
			var found []bool
			if found, err = s.GetBatch(cctx, cached, dsts); err == nil {
				for i := range found {
					if !found[i] || !bytes.Equal(dsts[i], blocks[i]) {
						t.Fatalf("get %d wrong", i)
					}
				}
			}
		case 3:
			var r client.LookupResult
			if r, err = s.Lookup(cctx, long); err == nil && r.Hits != len(cached) {
				t.Fatalf("lookup: %d hits, want %d", r.Hits, len(cached))
			}
		case 4:
			var rs []*client.Reservation
			if rs, err = s.ReserveBatch(cctx, fresh[:100]); err == nil {
				err = s.AbortBatch(cctx, rs) // may be cancelled too
			}
		}
		cancel()
		switch {
		case err == nil:
			completed++
		case errors.Is(err, context.Canceled):
			cancelled++
		default:
			t.Fatalf("iteration %d: %v, want nil or context.Canceled", iter, err)
		}
	}
	t.Logf("%d calls cancelled, %d completed", cancelled, completed)
	if cancelled < 30 {
		t.Fatalf("only %d calls were cancelled", cancelled)
	}
	// Abandoned grants are given back asynchronously; promptly.
	st, took, ok := waitStats(t, c, 2*time.Second, func(st *client.Stats) bool {
		return st.Tiers[0].Reserved == 0 && st.Tiers[0].Leased == 0
	})
	if !ok {
		t.Fatalf("leaked: %d reservations, %d leases", st.Tiers[0].Reserved, st.Tiers[0].Leased)
	}
	t.Logf("all grants back %v after the last call", took)
	if st.Tiers[0].Blocks != len(cached) || st.Tiers[0].UsedBytes != int64(len(cached)*bs) {
		t.Fatalf("tier: %+v", st.Tiers[0])
	}
	// The session is still healthy and the lookup data area was not
	// corrupted by late answers to abandoned lookups.
	r, err := s.Lookup(ctx, long)
	if err != nil || r.Hits != len(cached) {
		t.Fatalf("lookup after the cancellations: %+v %v", r, err)
	}
	roundTrip(t, s, 602)
}

// TestEvictionLRU: a small host tier evicts least-recently-used blocks, and
// never a leased one.
func TestEvictionLRU(t *testing.T) {
	t.Parallel()
	const bs = 1 << 20
	ip := startInProc(t, "32MiB", 4<<20, nil) // 8 slabs × 4 slots
	c := dial(t, ip.cfg.Socket)
	s := open(t, c, testNS("itest", bs))
	ctx := context.Background()
	hs := chain(700, 64)
	put := func(h client.Hash) {
		t.Helper()
		if ok, err := s.Put(ctx, h, payload(h, bs)); err != nil || !ok {
			t.Fatalf("put: %v %v", ok, err)
		}
	}
	put(hs[0])
	pinned, err := s.Acquire(ctx, hs[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs[1:] {
		put(h)
	}
	st := stats(t, c)
	const slots = 32
	if st.Tiers[0].Blocks != slots || st.Tiers[0].Evictions != uint64(len(hs)-slots) {
		t.Fatalf("after flooding: %d blocks, %d evictions; want %d, %d", st.Tiers[0].Blocks, st.Tiers[0].Evictions, slots, len(hs)-slots)
	}
	// The leased block survived and was never overwritten.
	if !bytes.Equal(pinned.Bytes(), payload(hs[0], bs)) {
		t.Fatal("leased block overwritten while pinned")
	}
	present := func(h client.Hash) bool {
		t.Helper()
		r, err := s.Lookup(ctx, []client.Hash{h})
		if err != nil {
			t.Fatal(err)
		}
		return r.Hits == 1
	}
	// Oldest gone, newest present: the 31 unpinned slots hold hs[33:].
	for i := 1; i < len(hs); i++ {
		want := i >= len(hs)-(slots-1)
		if got := present(hs[i]); got != want {
			t.Fatalf("block %d present=%v, want %v", i, got, want)
		}
	}
	if !present(hs[0]) {
		t.Fatal("leased block evicted")
	}
	if err := pinned.Release(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, bs)
	if err := s.Get(ctx, hs[0], got); err != nil || !bytes.Equal(got, payload(hs[0], bs)) {
		t.Fatalf("leased block after release: %v", err)
	}
	for _, h := range hs[len(hs)-8:] {
		if err := s.Get(ctx, h, got); err != nil || !bytes.Equal(got, payload(h, bs)) {
			t.Fatalf("newest block: %v", err)
		}
	}
	// Released, hs[0] is just another block: recency decides. Touch it,
	// then flood again: it outlives blocks used before it.
	r, err := s.Lookup(ctx, []client.Hash{hs[0]})
	if err != nil || r.Hits != 1 {
		t.Fatal(r, err)
	}
	more := chain(701, slots-2)
	for _, h := range more {
		put(h)
	}
	if !present(hs[0]) || present(hs[len(hs)-(slots-1)]) {
		t.Fatal("recency not respected after the release")
	}
}

// TestSessionLimit: the daemon refuses sessions beyond its limit with
// CodeBusy, and takes new ones once a slot frees up.
func TestSessionLimit(t *testing.T) {
	t.Parallel()
	ip := startInProc(t, "16MiB", 4<<20, func(c *daemon.Config) { c.Session.MaxSessions = 2 })
	c := dial(t, ip.cfg.Socket)
	ns := testNS("itest", 4096)
	a := open(t, c, ns)
	open(t, c, ns)
	_, err := c.Open(context.Background(), ns)
	var re *client.RefusedError
	if !errors.As(err, &re) || re.Code != shm.CodeBusy {
		t.Fatalf("third session: %v, want RefusedError code %d", err, shm.CodeBusy)
	}
	a.Close()
	deadline := time.Now().Add(2 * time.Second)
	for {
		s, err := c.Open(context.Background(), ns)
		if err == nil {
			roundTrip(t, s, 800)
			s.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session after one closed: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestIdleReleases: releases do not wait for the daemon; a session that
// goes idle right after releasing more leases than its completion ring
// holds still gets every one of them executed.
func TestIdleReleases(t *testing.T) {
	t.Parallel()
	const bs = 4096
	ip := startInProc(t, "16MiB", 4<<20, nil)
	c := dial(t, ip.cfg.Socket)
	s := open(t, c, testNS("itest", bs))
	ctx := context.Background()
	h := chain(900, 1)[0]
	if _, err := s.Put(ctx, h, payload(h, bs)); err != nil {
		t.Fatal(err)
	}
	n := 3 * ip.cfg.Session.RingEntries // leases of one block are counted
	hs := make([]client.Hash, n)
	for i := range hs {
		hs[i] = h
	}
	ls, err := s.AcquireBatch(ctx, hs)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range ls {
		if l == nil || !bytes.Equal(l.Bytes(), payload(h, bs)) {
			t.Fatalf("lease %d", i)
		}
	}
	if err := s.ReleaseBatch(ls); err != nil {
		t.Fatal(err)
	}
	// No further call on s: the client must drain on its own.
	st, took, ok := waitStats(t, c, 2*time.Second, func(st *client.Stats) bool { return st.Tiers[0].Leased == 0 })
	if !ok {
		t.Fatalf("block still leased 2s after %d releases: %+v", n, st.Tiers[0])
	}
	t.Logf("%d releases executed within %v", n, took)
}
