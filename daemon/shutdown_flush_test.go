package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// gatedHistogram holds every Observe (the tier chain's per-block swap-out
// observer, called after each batch a flush writes) until open is closed;
// entered is closed at the first one.
type gatedHistogram struct {
	prometheus.Histogram
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
}

func (g *gatedHistogram) Observe(v float64) {
	g.once.Do(func() { close(g.entered) })
	<-g.open
	g.Histogram.Observe(v)
}

// TestStopCutsFlushOnRequest: a stop (SIGTERM) that comes while a flush
// asked for by kvtierctl is writing the host tier down cuts that flush;
// the stop's own write-down (nvme.flush_on_stop) writes the rest. The
// request's flush ran on under its own 60 s bound, which Run waited for
// before its own write-down (60 s more) and the snapshot for a warm
// restart: past systemd's TimeoutStopSec (90 s), which SIGKILLs the daemon
// with the host tier half written and no snapshot stored.
//
// Either way kvtierctl hears why its flush ended, and whether the rest was
// written down: with flush_on_stop off the stop writes nothing more.
func TestStopCutsFlushOnRequest(t *testing.T) {
	for _, tc := range []struct {
		flushOnStop bool
		wantReply   string
	}{
		{true, "kvtierd is stopping: it cut this flush and writes the rest down itself"},
		{false, "nvme.flush_on_stop is off, so the rest is not written down"},
	} {
		t.Run(fmt.Sprintf("flush_on_stop=%v", tc.flushOnStop), func(t *testing.T) {
			testStopCutsFlushOnRequest(t, tc.flushOnStop, tc.wantReply)
		})
	}
}

func testStopCutsFlushOnRequest(t *testing.T, flushOnStop bool, wantReply string) {
	cfg := testConfig(t)
	cfg.Host.Capacity = 16 * MiB
	cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 64*MiB, flushOnStop
	cfg.Metrics.Listen = "127.0.0.1:0" // the swap-out observer is the metrics'
	var logBuf syncBuffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))
	gate := &gatedHistogram{entered: make(chan struct{}), open: make(chan struct{})}
	r := startDaemonWith(t, cfg, log, func(d *Daemon) {
		gate.Histogram = d.metrics.swapOut
		d.metrics.swapOut = gate
	})
	ctx := context.Background()
	c := dialDaemon(t, cfg)
	s, err := c.Open(ctx, testNamespace(64*KiB))
	if err != nil {
		t.Fatal(err)
	}
	// 6 MiB, under the high watermark (only a flush writes them down), and
	// more runs of 16 than the flush has writers (at most 4): each writer
	// writes one run before the stop and is held, so one run at least is
	// left for after it.
	const blocks = 96
	putBlocks(t, s, blocks)
	s.Close()

	admin := dialAdmin(t, cfg)
	defer admin.Close()
	if err := shm.SendMsg(admin, shm.EncodeMsg(shm.MsgFlushReq, shm.ProtocolVersion, nil)); err != nil {
		t.Fatal(err)
	}
	<-gate.entered // the flush has written a batch
	r.cancel()     // SIGTERM
	close(gate.open)
	r.stop(t)

	// kvtierctl flush is told why its flush ended, not left with a lost
	// connection: the reply went out before the daemon closed the socket.
	buf := make([]byte, 4096)
	raw, _, err := shm.RecvMsg(admin, buf, 0)
	if err != nil {
		t.Fatalf("flush reply after the stop: %v, want a reply saying the stop cut it", err)
	}
	ty, _, payload, err := shm.DecodeMsg(raw)
	if err != nil || ty != shm.MsgFlushReply {
		t.Fatalf("flush reply: type %d, err %v; want a flush reply", ty, err)
	}
	var reply struct {
		Blocks int    `json:"blocks"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal(payload, &reply); err != nil {
		t.Fatalf("flush reply %q: %v", payload, err)
	}
	if reply.Blocks <= 0 || reply.Blocks >= blocks {
		t.Errorf("flush reply counts %d blocks, want some but not all %d (the stop cut it)", reply.Blocks, blocks)
	}
	if !strings.Contains(reply.Error, wantReply) {
		t.Errorf("flush reply error %q, want it to say %q", reply.Error, wantReply)
	}

	var onRequest, onStop string
	for _, l := range strings.Split(logBuf.String(), "\n") {
		switch {
		case strings.Contains(l, `msg="host tier written down to nvme on request"`):
			onRequest = l
		case strings.Contains(l, `msg="host tier written down to nvme"`):
			onStop = l
		}
	}
	if !strings.Contains(onRequest, `err="context canceled"`) {
		t.Errorf("the flush on request ran on past the stop: %q, want it cut (err=\"context canceled\")", onRequest)
	}
	want := blocks // the stop wrote the rest
	switch {
	case !flushOnStop && onStop != "":
		t.Errorf("the stop wrote the host tier down with flush_on_stop off: %q", onStop)
	case !flushOnStop:
		want = reply.Blocks
	case onStop == "" || !strings.Contains(onStop, "err=<nil>"):
		t.Errorf("the stop's write-down: %q, want it done", onStop)
	}
	st, err := nvme.Open(ctx, nvme.Options{Dir: filepath.Join(cfg.StateDir, "nvme"), CapacityBytes: 64 * MiB,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("reopen nvme tier: %v", err)
	}
	defer st.Close()
	if n := st.Stats().Blocks; n != want {
		t.Errorf("nvme tier holds %d blocks after the stop, want %d (of %d)", n, want, blocks)
	}
}

// TestStopBudgetBoundsWriteDown: the stop's write-down gets what the drain
// of the sessions left of nvme.stop_budget_s, not a fixed 60 s after it.
// Before, a drain of 10 s (promotions) plus 10 s (quarantined copies)
// followed by a full 60 s write-down and Badger's close came within a few
// seconds of systemd's SIGKILL at 90 s. The drain's length is simulated by
// moving the stop's clock on once the sessions have ended.
func TestStopBudgetBoundsWriteDown(t *testing.T) {
	for _, tc := range []struct {
		name  string
		drain time.Duration
		want  int // blocks in NVMe after the stop
		log   string
	}{
		{"drain within budget", 10 * time.Second, 96, `msg="host tier written down to nvme"`},
		{"drain took the budget", 80 * time.Second, 0, `msg="stop budget spent before the write-down; the host tier is not written down to nvme"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Host.Capacity = 16 * MiB
			cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 64*MiB, true
			cfg.NVMe.StopBudgetSeconds = 75
			var logBuf syncBuffer
			log := slog.New(slog.NewTextHandler(&logBuf, nil))
			var moved atomic.Int64
			r := startDaemonWith(t, cfg, log, func(d *Daemon) {
				d.now = func() time.Time { return time.Now().Add(time.Duration(moved.Load())) }
				d.testAfterDrain = func() { moved.Store(int64(tc.drain)) }
			})
			c := dialDaemon(t, cfg)
			s, err := c.Open(context.Background(), testNamespace(64*KiB))
			if err != nil {
				t.Fatal(err)
			}
			putBlocks(t, s, 96) // 6 MiB: under the high watermark, only a write-down moves them
			s.Close()
			r.stop(t)
			if !strings.Contains(logBuf.String(), tc.log) {
				t.Errorf("stop log lacks %s:\n%s", tc.log, logBuf.String())
			}
			st, err := nvme.Open(context.Background(), nvme.Options{Dir: filepath.Join(cfg.StateDir, "nvme"),
				CapacityBytes: 64 * MiB, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("reopen nvme tier: %v", err)
			}
			defer st.Close()
			if n := st.Stats().Blocks; n != tc.want {
				t.Errorf("nvme tier holds %d blocks after a stop whose drain took %s of a 75s budget, want %d", n, tc.drain, tc.want)
			}
		})
	}
}
