package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// TestStopWritesQueuedParkedBlocks: with nvme.flush_on_stop off, a stop
// skips writing the host tier down, but parked requests are promised to
// survive (kept until resumed, released or their TTL, never dropped while
// the disk has room). Blocks still queued for their write-through when the
// tier chain stopped were left in the host tier (Chain.Wait: "Flush writes
// them"), which a stop without flush_on_stop never wrote: they were lost
// with the process. And a stop whose drain of the sessions spent
// nvme.stop_budget_s skipped their write-down too (flush_on_stop on or
// off); they now get parkedStopGrace. The park writers are held inside
// their first batch until the chain is told to stop, so that the rest is
// still queued; the drain's length is simulated by moving the stop's clock.
func TestStopWritesQueuedParkedBlocks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flush bool
		drain time.Duration
	}{
		{"flush_on_stop off", false, 0},
		{"flush_on_stop off, drain took the budget", false, 80 * time.Second},
		{"flush_on_stop on, drain took the budget", true, 80 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Host.Capacity = 16 * MiB
			cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 64*MiB, tc.flush
			cfg.NVMe.StopBudgetSeconds = 75
			// 10 MiB parked at once is past half of this small tier's
			// budget (16 MiB), and parks on their way down count.
			cfg.NVMe.ParkedShare = 1
			cfg.Metrics.Listen = "127.0.0.1:0" // the swap-out observer is the metrics'
			gate := &gatedHistogram{entered: make(chan struct{}), open: make(chan struct{})}
			var moved atomic.Int64
			r := startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), func(d *Daemon) {
				gate.Histogram = d.metrics.swapOut
				d.metrics.swapOut = gate
				d.testChainStopped = func() { close(gate.open) }
				d.now = func() time.Time { return time.Now().Add(time.Duration(moved.Load())) }
				d.testAfterDrain = func() { moved.Store(int64(tc.drain)) }
			})
			ctx := context.Background()
			c := dialDaemon(t, cfg)
			s, err := c.Open(ctx, testNamespace(64*KiB))
			if err != nil {
				t.Fatal(err)
			}
			// 10 MiB: many more runs of 16 than the chain has park writers
			// (at most 4), each of which writes one and is held.
			const blocks = 160
			parked := make([][]byte, blocks)
			for i := range parked {
				parked[i] = bytes.Repeat([]byte{byte(i + 1)}, s.BlockBytes())
			}
			if err := s.Park(ctx, 1, parked); err != nil {
				t.Fatal(err)
			}
			ns := s.NamespaceID() | tiers.ParkedNS
			s.Close()
			<-gate.entered // a park writer has written its first batch
			r.stop(t)

			st, err := nvme.Open(ctx, nvme.Options{Dir: filepath.Join(cfg.StateDir, "nvme"), CapacityBytes: 64 * MiB,
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("reopen nvme tier: %v", err)
			}
			defer st.Close()
			n := 0
			st.Keys(func(k nvme.Key, _ int64) bool {
				if k.NS == ns {
					n++
				}
				return true
			})
			if n != blocks {
				t.Fatalf("nvme tier holds %d of the %d parked blocks after a stop (flush_on_stop %v) whose drain took %v of a 75s budget, want all", n, blocks, tc.flush, tc.drain)
			}
		})
	}
}
