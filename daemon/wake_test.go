package daemon

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// TestPromotionWakesSleepingLoop: a get of a block that is only in NVMe
// completes as soon as its promotion does, even when the ring loop went to
// sleep on the doorbell meanwhile. The loop's sleep bound is raised to an
// hour, so a wake-up the daemon loses hangs the get until its deadline
// instead of costing it 50 ms, and so does a stop the loop sleeps
// through (the daemon's Run, cancelled at the end, must return at once). (Before the fix the loop checked for
// finished promotions only before its spin: one finishing during the spin
// left it asleep, and a third of the replay's requests that read from NVMe
// waited the whole bound.)
func TestPromotionWakesSleepingLoop(t *testing.T) {
	cfg := testConfig(t) // 8 MiB host tier
	cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 256*MiB
	r := startDaemonWith(t, cfg, nil, func(d *Daemon) { d.sleepBound = time.Hour })
	c := dialDaemon(t, cfg)
	ctx := context.Background()
	s, err := c.Open(ctx, testNamespace(64*KiB))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const blocks = 384 // 24 MiB: the first ones go down to NVMe
	hs := putPastHost(t, r, s, blocks)
	// No lookup first: it would prefetch the blocks, and the gets below
	// must each wait for a promotion of their own.
	before := r.d.chain.Stats().Promoted
	dst := make([]byte, s.BlockBytes())
	var slowest time.Duration
	for i := range blocks / 2 {
		gctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		t0 := time.Now()
		err := s.Get(gctx, hs[i], dst)
		cancel()
		slowest = max(slowest, time.Since(t0))
		if err != nil {
			t.Fatalf("get %d (%d promotions so far): %v", i, r.d.chain.Stats().Promoted-before, err)
		}
		if !bytes.Equal(dst, block(hs[i], len(dst))) {
			t.Fatalf("get %d: wrong bytes", i)
		}
	}
	promoted := r.d.chain.Stats().Promoted - before
	t.Logf("%d gets, %d promotions, slowest %v", blocks/2, promoted, slowest)
	if promoted < blocks/4 {
		t.Fatalf("only %d of %d gets needed a promotion: the test did not exercise the wait", promoted, blocks/2)
	}
}

// putPastHost puts a chain of n blocks through s, letting the mover demote
// rather than the host tier drop them, and returns their hashes.
func putPastHost(t *testing.T, r *running, s *client.Session, n int) []client.Hash {
	t.Helper()
	hs := testBlocks(5, n) // a chain: the policy keeps only blocks whose parent it saw
	for i, h := range hs {
		if _, err := s.Put(context.Background(), h, block(h, s.BlockBytes())); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if ht := r.d.Stats().Tiers[0]; float64(ht.UsedBytes) <= 0.95*float64(ht.CapacityBytes) {
				break
			}
		}
	}
	return hs
}

// TestLatePromotionAfterSessionClosed: a get waits for a promotion from a
// stalled disk, and its client dies. The session waits deferredWait for
// the promotion, gives up and unmaps its ring region; when the disk
// answers, the promotion's completion must neither write the unmapped
// ring's doorbell (before the fix: SIGSEGV, the whole daemon down) nor
// leak the lease it carries.
func TestLatePromotionAfterSessionClosed(t *testing.T) {
	cfg := testConfig(t) // 8 MiB host tier
	cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 256*MiB
	var armed atomic.Bool
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	r := startDaemonWith(t, cfg, nil, func(d *Daemon) {
		d.deferredWait = 100 * time.Millisecond
		// The daemon's chain, with a swap-in observer (it runs on the
		// promotion worker before the waiters are called) that stalls
		// once armed: a disk that does not answer.
		cc := d.chainConfig()
		cc.ObserveSwapIn = func(time.Duration) {
			if armed.Load() {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-gate
			}
		}
		ch, err := tiers.NewChain(d.host, d.nvme, cc)
		if err != nil {
			t.Fatal(err)
		}
		d.chain = ch
	})
	ctx := context.Background()
	s, err := dialDaemon(t, cfg).Open(ctx, testNamespace(64*KiB))
	if err != nil {
		t.Fatal(err)
	}
	hs := putPastHost(t, r, s, 384)
	k := tiers.Key{NS: s.NamespaceID(), Hash: hs[0]}
	if !r.d.nvme.Contains(nvme.Key{NS: k.NS, Hash: k.Hash}) || r.d.host.Contains(k) {
		t.Fatal("block 0 is not in NVMe only")
	}
	r.d.mu.Lock()
	if len(r.d.sessions) != 1 {
		t.Fatalf("%d sessions, want 1", len(r.d.sessions))
	}
	var ss *session
	for _, ss = range r.d.sessions {
	}
	r.d.mu.Unlock()

	armed.Store(true)
	got := make(chan error, 1)
	go func() { got <- s.Get(ctx, hs[0], make([]byte, s.BlockBytes())) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the promotion did not start")
	}
	ss.stop() // the client died (clientExited's way)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ss.ringMu.RLock()
		gone := ss.unmapped
		ss.ringMu.RUnlock()
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the session did not close")
		}
	}
	if err := <-got; err == nil {
		t.Fatal("a get of a closed session succeeded")
	}
	close(gate) // the disk answers: the completion finds the ring unmapped
	for deadline := time.Now().Add(5 * time.Second); r.d.host.Stats().Leased != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d leases still held after the late promotion", r.d.host.Stats().Leased)
		}
	}
	// The daemon still serves: a new session reads a block back.
	s2, err := dialDaemon(t, cfg).Open(ctx, testNamespace(64*KiB))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	h := testBlocks(6, 1)[0]
	if _, err := s2.Put(ctx, h, block(h, s2.BlockBytes())); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, s2.BlockBytes())
	if err := s2.Get(ctx, h, dst); err != nil || !bytes.Equal(dst, block(h, len(dst))) {
		t.Fatalf("get after the late promotion: %v", err)
	}
}
