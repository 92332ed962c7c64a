package daemon

import (
	"bytes"
	"context"
	"testing"
	"time"
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
	const blocks = 384          // 24 MiB: the first ones go down to NVMe
	hs := testBlocks(5, blocks) // a chain: the policy keeps only blocks whose parent it saw
	for i, h := range hs {
		if _, err := s.Put(ctx, h, block(h, s.BlockBytes())); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		// Let the mover demote rather than the host tier drop blocks.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if ht := r.d.Stats().Tiers[0]; float64(ht.UsedBytes) <= 0.95*float64(ht.CapacityBytes) {
				break
			}
		}
	}
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
