package daemon

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
)

// TestReloadCapacities shrinks the host tier's capacity target and the
// NVMe tier's budget of a running daemon with a session open: the mover
// demotes the host tier under the target, the NVMe store evicts under its
// new budget, and the session keeps working throughout.
func TestReloadCapacities(t *testing.T) {
	cfg := testConfig(t)
	cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 128*MiB
	r := startDaemon(t, cfg, nil)
	if r.d.nvme == nil {
		t.Fatal("nvme tier did not open")
	}
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: cfg.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, testNamespace(256*KiB))
	if err != nil {
		t.Fatal(err)
	}
	put := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			b := bytes.Repeat([]byte{byte(i + 1)}, s.BlockBytes())
			if _, err := s.Put(ctx, testHash(i), b); err != nil {
				t.Fatalf("put %d: %v", i, err)
			}
			// Pace the puts like a workload's think time does: blocks
			// written faster than the mover demotes them are dropped by the
			// host tier's own eviction, which would starve the NVMe tier.
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				used, capacity := r.d.host.Usage()
				if high, _ := r.d.chain.Watermarks(); float64(used) <= high*float64(capacity) {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	get := func(i int) {
		t.Helper()
		dst := make([]byte, s.BlockBytes())
		if err := s.Get(ctx, testHash(i), dst); err != nil || dst[0] != byte(i+1) {
			t.Fatalf("get %d: %v (first byte %d)", i, err, dst[0])
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for t0 := time.Now(); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Since(t0) > 15*time.Second {
				t.Fatalf("%s: not within 15s (host %+v, nvme %+v)", what, r.d.host.Stats(), r.d.nvme.Stats())
			}
		}
	}

	// Host tier: 6 of 8 MiB, under the high watermark.
	put(0, 24)
	if used := r.d.host.Stats().UsedBytes; used < 6*MiB {
		t.Fatalf("host tier holds %d bytes before the reload, want 6MiB", used)
	}
	next := cfg
	next.Host.Capacity = 4 * MiB
	if err := r.d.Reload(next); err != nil {
		t.Fatal(err)
	}
	if got := r.d.Config().Host.Capacity; got != 4*MiB {
		t.Fatalf("host.capacity in effect %v, want 4MiB", got)
	}
	if h, _ := r.d.chain.Watermarks(); h != cfg.Host.HighWatermark/2 {
		t.Fatalf("effective high watermark %v, want %v", h, cfg.Host.HighWatermark/2)
	}
	limit := int64(float64(4*MiB) * cfg.Host.HighWatermark)
	waitFor("host tier under its new target", func() bool { return r.d.host.Stats().UsedBytes <= limit })
	if r.d.chain.Stats().Demoted == 0 {
		t.Error("nothing demoted to NVMe")
	}
	get(0) // demoted: promoted back from NVMe
	get(23)

	// A capacity above the arena is capped at it.
	next.Host.Capacity = 16 * MiB
	if err := r.d.Reload(next); err != nil {
		t.Fatal(err)
	}
	if got := r.d.Config().Host.Capacity; got != cfg.Host.Capacity {
		t.Fatalf("host.capacity in effect %v, want the arena's %v", got, cfg.Host.Capacity)
	}
	if h, l := r.d.chain.Watermarks(); h != cfg.Host.HighWatermark || l != cfg.Host.LowWatermark {
		t.Fatalf("watermarks %v/%v after the cap, want the configured ones", h, l)
	}

	// NVMe tier: fill it well past half, then halve its budget.
	const n = 400 // 100 MiB
	put(24, n)
	waitFor("nvme tier filled", func() bool { return r.d.nvme.Stats().Bytes > 64*MiB })
	next.NVMe.Capacity = 64 * MiB
	if err := r.d.Reload(next); err != nil {
		t.Fatal(err)
	}
	if st := r.d.nvme.Stats(); st.Capacity != 64*MiB {
		t.Fatalf("nvme stats capacity %d after the reload, want 64MiB", st.Capacity)
	}
	if st := r.d.Stats(); st.Tiers[len(st.Tiers)-1].CapacityBytes != 64*MiB {
		t.Errorf("status tiers %+v", st.Tiers)
	}
	waitFor("nvme tier under its new budget", func() bool {
		st := r.d.nvme.Stats()
		return st.Bytes <= 64*MiB && st.DiskBytes <= 64*MiB
	})
	if r.d.Config().NVMe.Capacity != 64*MiB {
		t.Errorf("nvme.capacity in effect %v", r.d.Config().NVMe.Capacity)
	}
	// The session survived: recent blocks are served and new ones go in.
	get(n - 1)
	put(n, n+8)
	get(n + 7)

	// A budget the store refuses (below four of its segment files is
	// impossible here: 64MiB is its minimum) — and an invalid one is
	// refused by Validate as a whole.
	bad := next
	bad.NVMe.Capacity = 32 * MiB
	bad.Host.Capacity = 2 * MiB
	if err := r.d.Reload(bad); err == nil {
		t.Error("Reload accepted nvme.capacity 32MiB")
	}
	if got := r.d.Config(); got.NVMe.Capacity != 64*MiB || got.Host.Capacity != cfg.Host.Capacity {
		t.Errorf("a refused reload changed the capacities: host %v nvme %v", got.Host.Capacity, got.NVMe.Capacity)
	}
	s.Close()
}

// TestReloadIgnoresSlabChange: host.slab_bytes needs a restart, so a
// reload that changes it (with host.capacity left unset: the running
// arena's size is kept) warns about it and applies the live fields. The
// running capacity is a whole number of the running slabs, not of the new
// ones, and must not make the reload fail as a whole.
func TestReloadIgnoresSlabChange(t *testing.T) {
	cfg := testConfig(t) // an 8MiB arena of 1MiB slabs
	logs := &syncBuffer{}
	log := cfg.Log.NewLogger(logs)
	r := startDaemon(t, cfg, log)

	path := writeTOML(t, "[host]\nslab_bytes = \"16MiB\"\nprefault = false\nhigh_watermark = 0.7\nlow_watermark = 0.5\n"+
		"[log]\nlevel = \"debug\"\n[nvme]\nenabled = false\n")
	args := []string{"-config", path, "-runtime-dir", cfg.RuntimeDir, "-state-dir", cfg.StateDir, "-metrics-listen", ""}
	next, err := ReloadFromArgs(args, r.d.Config())
	if err != nil {
		t.Fatalf("ReloadFromArgs: %v", err)
	}
	if err := r.d.Reload(next); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	got := r.d.Config()
	if got.Log.Level != "debug" || got.Host.HighWatermark != 0.7 || got.Host.LowWatermark != 0.5 ||
		got.Host.Capacity != cfg.Host.Capacity || got.Host.SlabBytes != cfg.Host.SlabBytes {
		t.Errorf("config in effect = %+v", got.Host)
	}
	if h, l := r.d.chain.Watermarks(); h != 0.7 || l != 0.5 {
		t.Errorf("watermarks = %v/%v, want 0.7/0.5", h, l)
	}
	if !strings.Contains(logs.String(), "fields=host.slab_bytes") {
		t.Errorf("no restart warning naming host.slab_bytes in:\n%s", logs.String())
	}

	// A file whose own host.capacity is not two of its slabs is invalid
	// and still refused as a whole.
	bad := writeTOML(t, "[host]\nslab_bytes = \"16MiB\"\ncapacity = \"8MiB\"\n[log]\nlevel = \"warn\"\n[nvme]\nenabled = false\n")
	if _, err := ReloadFromArgs([]string{"-config", bad, "-runtime-dir", cfg.RuntimeDir, "-state-dir", cfg.StateDir}, r.d.Config()); err == nil ||
		!strings.Contains(err.Error(), "host.capacity") {
		t.Errorf("ReloadFromArgs of an inconsistent file = %v, want a host.capacity error", err)
	}
}

// TestReloadHostCapacityReported: a reloaded host.capacity is the capacity
// in effect (the mover keeps the tier under it), and the status and
// kvtier_tier_capacity_bytes{tier="host"} ("configured capacity") report
// it, as they report a reloaded nvme.capacity. They used to go on
// reporting the arena, so kvtierctl plan --live and bench sized their
// working sets from capacity the daemon no longer kept.
func TestReloadHostCapacityReported(t *testing.T) {
	md := startMetricsDaemon(t, false) // a 32MiB arena of 4MiB slabs
	capacity := func() (status, metric int64) {
		t.Helper()
		v := scrape(t, md.d.MetricsAddr()).must(t, "kvtier_tier_capacity_bytes", "tier", "host")
		return md.d.Stats().Tiers[0].CapacityBytes, int64(v)
	}
	for _, tt := range []struct {
		reload ByteSize
		want   int64
	}{
		{16 * MiB, 16 * MiB},
		{64 * MiB, 32 * MiB}, // capped at the arena
		{8 * MiB, 8 * MiB},
	} {
		next := md.d.Config()
		next.Host.Capacity = tt.reload
		if err := md.d.Reload(next); err != nil {
			t.Fatal(err)
		}
		if s, m := capacity(); s != tt.want || m != tt.want {
			t.Errorf("after a reload of host.capacity %v: status capacity %v, metric %v; want %v",
				tt.reload, ByteSize(s), ByteSize(m), ByteSize(tt.want))
		}
	}
}
