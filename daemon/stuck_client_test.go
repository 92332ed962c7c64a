package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
)

// processCPU is the CPU time (user + system) this process used so far.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestStuckClientsDoNotBurnCPU: clients that stop consuming completions (a
// stopped or hung engine) leave their completion rings full, with entries
// queued behind them. Their ring loops can take nothing and must idle
// until the clients consume again: before the fix each one woke every
// 50 µs for as long as its client stayed stuck (64 such sessions: about 20% of
// a CPU, where as many idle sessions cost nothing). Once the clients pop
// their completions, the queued entries must be served at once (the
// loops' sleep bound is an hour: a missed wake-up hangs them).
func TestStuckClientsDoNotBurnCPU(t *testing.T) {
	cfg := testConfig(t)
	cfg.Session.RingEntries = 64
	cfg.Session.SpinMicros = 0 // idle loops sleep at once: only stuck ones could cost CPU
	d := startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), func(d *Daemon) { d.sleepBound = time.Hour }).d
	const sessions = 64
	peers := make([]*rawPeer, sessions)
	for i := range peers {
		p, code := rawOpen(t, cfg.Socket, rawNS("raw-stuck", 4096))
		if p == nil {
			t.Fatalf("session %d refused: %d", i, code)
		}
		peers[i] = p
		n := int(p.w.Ring.Entries)
		es := make([]shm.SQE, n)
		for j := range es {
			es[j] = shm.SQE{Op: shm.OpNop, UserData: uint64(j + 1)}
		}
		// Fill the completion ring and never pop it, then the submission
		// ring behind it.
		for round := range 2 {
			if k := p.ring.ClientPush(es); k != n {
				t.Fatalf("session %d round %d: pushed %d of %d", i, round, k, n)
			}
			p.ring.ClientWake()
			for deadline := time.Now().Add(5 * time.Second); round == 0 && p.ring.ClientSQSpace() != n; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("session %d: the daemon did not take the first ring's worth", i)
				}
			}
		}
	}
	time.Sleep(20 * time.Millisecond)
	runtime.GC() // the daemon's start (BTF) left garbage a collection would bill to the window
	// How often the loops wake is the measure (CPU time would be the
	// machine's noise as much as ours); the CPU share is logged.
	const window = 300 * time.Millisecond
	c0, w0, k0 := processCPU(t), time.Now(), d.roomWaits.Load()
	time.Sleep(window)
	used, wall, waits := processCPU(t)-c0, time.Since(w0), d.roomWaits.Load()-k0
	t.Logf("%d stuck sessions: %d waits for room, %v of CPU in %v (%.1f%% of a CPU)", sessions, waits, used,
		wall.Round(time.Millisecond), 100*float64(used)/float64(wall))
	if waits > 2*sessions {
		t.Errorf("%d sessions whose clients stopped consuming completions woke their loops %d times in %v, want at most %d",
			sessions, waits, wall.Round(time.Millisecond), 2*sessions)
	}

	// The clients consume again: every queued entry is answered.
	for i, p := range peers {
		n := int(p.w.Ring.Entries)
		out := make([]shm.CQE, 2*n)
		got := 0
		for deadline := time.Now().Add(5 * time.Second); got < len(out); {
			got += p.ring.ClientPop(out[got:])
			if got == len(out) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %d: %d of %d completions 5 s after its client consumed again", i, got, len(out))
			}
			p.ring.ClientWait(0, time.Millisecond, nil)
		}
	}
}

// TestPromotionsOwningTheRingComplete: a batch of gets of blocks that are
// only in NVMe, larger than the ring, leaves the loop with every free
// completion slot owed to a promotion under way: it can take nothing until
// they finish, and each one that finishes must wake it (the sleep bound is
// an hour, so a missed wake-up hangs the batch).
func TestPromotionsOwningTheRingComplete(t *testing.T) {
	cfg := testConfig(t) // 8 MiB host tier
	cfg.Session.RingEntries = 64
	cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 256*MiB
	r := startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), func(d *Daemon) { d.sleepBound = time.Hour })
	c := dialDaemon(t, cfg)
	s, err := c.Open(context.Background(), testNamespace(64*KiB))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const blocks = 384 // 24 MiB: the first ones go down to NVMe
	hs := putPastHost(t, r, s, blocks)
	const n = 96 // more than the ring, fewer than the host tier holds
	dsts := make([][]byte, n)
	for i := range dsts {
		dsts[i] = make([]byte, s.BlockBytes())
	}
	before := r.d.chain.Stats().Promoted
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	found, err := s.GetBatch(ctx, hs[:n], dsts)
	if err != nil {
		t.Fatalf("get batch (%d promotions so far): %v", r.d.chain.Stats().Promoted-before, err)
	}
	for i := range found {
		if found[i] && !bytes.Equal(dsts[i], block(hs[i], len(dsts[i]))) {
			t.Fatalf("block %d: wrong bytes", i)
		}
	}
	if p := r.d.chain.Stats().Promoted - before; p < uint64(cfg.Session.RingEntries) {
		t.Fatalf("%d promotions: the ring never filled with them", p)
	}
}
