package itest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
)

// TestResumeHostFullNotGone: a Resume that finds the host tier full of
// other sessions' reservations cannot bring the parked blocks up from NVMe
// for now. The request is intact (nothing released), so Resume must not
// answer ErrNotFound, which says its blocks are gone (TTL, or never
// parked), and a caller would recompute and leave them parked until the
// TTL; it answers ErrFull, and the same Resume works once slots are free.
func TestResumeHostFullNotGone(t *testing.T) {
	const bs = 1 << 20
	ip := startInProc(t, "32MiB", 4<<20, withNVMe)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := dial(t, ip.cfg.Socket)
	s := open(t, c, testNS("park-full", bs))
	other := open(t, c, testNS("park-full", bs))

	const req, n = 9, 8
	blocks := make([][]byte, n)
	for i := range blocks {
		blocks[i] = payload(client.Hash{Hi: req, Lo: uint64(i) + 500}, bs)
	}
	if err := s.Park(ctx, req, blocks); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := waitStats(t, c, 5*time.Second, func(st *client.Stats) bool {
		used, _ := hostUsed(st)
		return st.ParkedBlocks == n && used == 0
	}); !ok {
		t.Fatalf("parked blocks not swapped out: %+v", stats(t, c).Tiers)
	}
	// Another session holds all but 4 of the host tier's 32 slots.
	rs, err := other.ReserveBatch(ctx, chain(21, 28))
	if err != nil {
		t.Fatal(err)
	}
	defer other.AbortBatch(context.Background(), rs)
	dsts := make([][]byte, n)
	for i := range dsts {
		dsts[i] = make([]byte, bs)
	}
	err = s.Resume(ctx, req, dsts)
	if err == nil {
		t.Fatal("resume of 8 MiB into 4 free MiB succeeded")
	}
	if got := parkedBlocks(t, c); got != n {
		t.Fatalf("%d parked blocks after the failed resume, want all %d", got, n)
	}
	if errors.Is(err, client.ErrNotFound) || !errors.Is(err, client.ErrFull) {
		t.Fatalf("resume with the host tier full of reservations: %v; want ErrFull, not ErrNotFound (the request is intact)", err)
	}
	if err := other.AbortBatch(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(ctx, req, dsts); err != nil {
		t.Fatalf("resume once the host tier has room: %v", err)
	}
	for i := range dsts {
		if !bytes.Equal(dsts[i], blocks[i]) {
			t.Fatalf("resumed block %d differs", i)
		}
	}
}

// parkRig is a daemon whose 64 MiB NVMe budget four 16 MiB parked requests
// fill, beside a 32 MiB host tier.
type parkRig struct {
	ctx context.Context
	c   *client.Client
	s   *client.Session
	ns  client.Namespace
}

const (
	parkRigBlock = 1 << 20
	parkRigPer   = 16 // blocks per parked request
)

func newParkRig(t *testing.T, name string) *parkRig {
	ip := startInProc(t, "32MiB", 4<<20, func(c *daemon.Config) {
		withNVMe(c)
		c.NVMe.Capacity = 64 << 20
		// These tests fill the whole budget with parked blocks.
		c.NVMe.ParkedShare = 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	r := &parkRig{ctx: ctx, c: dial(t, ip.cfg.Socket), ns: testNS(name, parkRigBlock)}
	r.s = open(t, r.c, r.ns)
	return r
}

// park parks request req and waits until its write-through to NVMe is done
// or has failed (the disk budget is full of parked blocks).
func (r *parkRig) park(t *testing.T, req uint64) (blocks [][]byte, failed bool) {
	t.Helper()
	st0, err := r.c.Stats(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	m0 := moveStats(st0, "host", "nvme")
	blocks = make([][]byte, parkRigPer)
	for i := range blocks {
		blocks[i] = payload(client.Hash{Hi: req, Lo: uint64(i) + 700}, parkRigBlock)
	}
	if err := r.s.Park(r.ctx, req, blocks); err != nil {
		t.Fatalf("park %d: %v", req, err)
	}
	st, _, ok := waitStats(t, r.c, 5*time.Second, func(st *client.Stats) bool {
		m := moveStats(st, "host", "nvme")
		return m.Blocks >= m0.Blocks+parkRigPer || m.Errors > m0.Errors
	})
	if !ok {
		t.Fatalf("park %d neither written through nor refused: %+v", req, st.Tiers)
	}
	return blocks, moveStats(st, "host", "nvme").Errors > m0.Errors
}

// TestParkedKeptWhenDiskFreesUp: a parked request whose write-through
// failed because parked requests filled the NVMe budget stays in the host
// tier. Once the disk has room again (those requests resumed), it must not
// be dropped for space: a host tier short of slots evicts it unless it is
// held (and written down when it can be).
func TestParkedKeptWhenDiskFreesUp(t *testing.T) {
	r := newParkRig(t, "park-disk")
	// Park 16 MiB requests until one cannot be written through.
	var full uint64
	var fullBlocks [][]byte
	for req := uint64(1); req <= 8 && full == 0; req++ {
		if blocks, failed := r.park(t, req); failed {
			full, fullBlocks = req, blocks
		}
	}
	if full == 0 {
		t.Fatal("128 MiB of parked requests never filled a 64 MiB NVMe budget")
	}
	// Resume the others: the disk has room again.
	dst := make([][]byte, parkRigPer)
	for i := range dst {
		dst[i] = make([]byte, parkRigBlock)
	}
	for req := uint64(1); req < full; req++ {
		if err := r.s.Resume(r.ctx, req, dst); err != nil {
			t.Fatalf("resume %d: %v", req, err)
		}
	}
	// Another session wants the whole host tier.
	other := open(t, r.c, r.ns)
	rs, _ := other.ReserveBatch(r.ctx, chain(31, 32))
	if err := other.AbortBatch(r.ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := r.s.Resume(r.ctx, full, dst); err != nil {
		t.Fatalf("resume of the request parked while the disk was full, after the disk had room: %v", err)
	}
	for i := range dst {
		if !bytes.Equal(dst[i], fullBlocks[i]) {
			t.Fatalf("resumed block %d differs", i)
		}
	}
}

// TestFailedParksHoldAtMostHalfTheHost: parked blocks that cannot be
// written through (the disk budget is full of parked requests) stay pinned
// for a retry, but only up to half the host tier: parks failing beyond it
// leave their blocks evictable, so a session's own puts still get half the
// tier however many parks fail.
func TestFailedParksHoldAtMostHalfTheHost(t *testing.T) {
	r := newParkRig(t, "park-share")
	// Park 16 MiB requests until write-through fails, then two more.
	failed := 0
	for req := uint64(1); req <= 12 && failed < 3; req++ {
		if _, f := r.park(t, req); f {
			failed++
		}
	}
	if failed < 3 {
		t.Fatal("parked requests never filled the 64 MiB NVMe budget")
	}
	// Another session wants half the host tier. The mover's attempts to
	// write the evictable parked blocks down (failing: the disk is full of
	// parked blocks) pin a few of them for a moment, so a reservation can
	// be refused at that instant: those still missing are asked again,
	// for at most 2 s, holding the ones granted.
	other := open(t, r.c, r.ns)
	hs := chain(41, parkRigPer)
	rs := make([]*client.Reservation, len(hs))
	var err error
	got := 0
	for deadline := time.Now().Add(2 * time.Second); got < parkRigPer && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		var miss []int
		var ask []client.Hash
		for i, res := range rs {
			if res == nil {
				miss, ask = append(miss, i), append(ask, hs[i])
			}
		}
		var more []*client.Reservation
		more, err = other.ReserveBatch(r.ctx, ask)
		for j, res := range more {
			if res != nil {
				rs[miss[j]] = res
				got++
			}
		}
	}
	if got != parkRigPer {
		st, _ := r.c.Stats(r.ctx)
		used, capacity := hostUsed(st)
		t.Fatalf("reserved %d of %d blocks (err %v) with %d of %d host bytes used: failed parks pinned more than half the tier",
			got, parkRigPer, err, used, capacity)
	}
	if err := other.AbortBatch(r.ctx, rs); err != nil {
		t.Fatal(err)
	}
}
