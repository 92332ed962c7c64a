package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// putBlocks stores n distinct blocks of 64 KiB (seed tells sets apart) and
// returns the session, still open.
func putBlocks(t *testing.T, sock string, seed uint32, n int) *client.Session {
	t.Helper()
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: sock, Name: "kvtierctl-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.Open(ctx, benchNamespace(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 64<<10)
	for i := range n {
		block[0], block[1] = byte(i), byte(seed)
		stored, err := s.Put(ctx, client.HashBlock(client.Hash{}, []uint32{seed, uint32(i)}), block)
		if err != nil || !stored {
			t.Fatalf("put %d: stored %v, %v", i, stored, err)
		}
	}
	return s
}

func TestComputeTopFrame(t *testing.T) {
	prev := &shm.Stats{
		Version: "v", PID: 42, UptimeSeconds: 10,
		Tiers: []shm.TierStats{
			{Name: "host", CapacityBytes: 1000, UsedBytes: 100, Blocks: 1, Hits: 100, Misses: 50, Evictions: 3, HitRatio: 0.66},
			{Name: "nvme", CapacityBytes: 4000, Hits: 7, Misses: 7},
		},
		SessionsTotal: 5, Sessions: 2,
		Ops:   map[string]uint64{"get": 1000, "put": 500, "lookup": 0},
		Moves: []shm.MoveStats{{From: "host", To: "nvme", Blocks: 10, Bytes: 10 << 20, Seconds: 0.5}, {From: "nvme", To: "host", Blocks: 4, Bytes: 4 << 20, Seconds: 1}},
	}
	cur := &shm.Stats{
		Version: "v", PID: 42, UptimeSeconds: 12,
		Tiers: []shm.TierStats{
			{Name: "host", CapacityBytes: 1000, UsedBytes: 250, Blocks: 3, Leased: 1, Hits: 180, Misses: 70, Evictions: 7, HitRatio: 0.72},
			{Name: "nvme", CapacityBytes: 4000, UsedBytes: 400, Hits: 7, Misses: 7},
		},
		SessionsTotal: 9, Sessions: 3, SessionsBad: 1, ParkedBlocks: 6,
		Namespaces: []shm.NamespaceStats{{ID: 1}},
		Ops:        map[string]uint64{"get": 1600, "put": 700, "lookup": 0},
		// A move seen for the first time counts from zero.
		Moves: []shm.MoveStats{{From: "host", To: "nvme", Blocks: 30, Bytes: 50 << 20, Errors: 2, Seconds: 0.9}, {From: "nvme", To: "host", Blocks: 4, Bytes: 4 << 20, Seconds: 1},
			{From: "host", To: "gpu", Blocks: 8, Bytes: 8 << 20, Seconds: 0.08}},
	}
	f := computeTopFrame(prev, cur, 2*time.Second, time.Unix(0, 0))

	near := func(what string, got *float64, want float64) {
		t.Helper()
		if got == nil || math.Abs(*got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", what, fmtPtr(got), want)
		}
	}
	if f.IntervalSeconds != 2 || f.PID != 42 || f.ParkedBlocks != 6 {
		t.Errorf("frame header %+v", f)
	}
	h := f.Tiers[0]
	if h.Hits != 80 || h.Misses != 20 || h.Blocks != 3 || h.Leased != 1 || h.UsedShare != 0.25 || h.HitRatioTotal != 0.72 {
		t.Errorf("host tier %+v", h)
	}
	near("host hits/s", h.HitsPerSec, 40)
	near("host misses/s", h.MissesPerSec, 10)
	near("host hit ratio", h.HitRatio, 0.8)
	near("host evictions/s", h.EvictPerSec, 2)
	n := f.Tiers[1]
	if n.HitRatio != nil || n.Hits != 0 {
		t.Errorf("nvme had no accesses in the interval but %+v", n)
	}
	near("nvme hits/s", n.HitsPerSec, 0)

	if len(f.Moves) != 3 {
		t.Fatalf("moves %+v", f.Moves)
	}
	d := f.Moves[0]
	if d.Blocks != 20 || d.Errors != 2 || d.BlocksTotal != 30 {
		t.Errorf("host→nvme %+v", d)
	}
	near("demote blocks/s", d.BlocksPerSec, 10)
	near("demote bytes/s", d.BytesPerSec, float64(40<<20)/2)
	near("demote mean copy", d.MeanCopySeconds, 0.4/20)
	if p := f.Moves[1]; p.Blocks != 0 || p.MeanCopySeconds != nil {
		t.Errorf("nvme→host moved nothing but %+v", p)
	}
	near("new move blocks/s", f.Moves[2].BlocksPerSec, 4)
	near("new move mean copy", f.Moves[2].MeanCopySeconds, 0.01)

	if len(f.Ops) != 3 || f.Ops[0].Op != "get" || f.Ops[1].Op != "lookup" || f.Ops[2].Op != "put" {
		t.Fatalf("ops %+v", f.Ops)
	}
	near("get/s", f.Ops[0].PerSec, 300)
	near("lookup/s", f.Ops[1].PerSec, 0)
	near("put/s", f.Ops[2].PerSec, 100)
	near("ops/s", f.OpsPerSec, 400)
	near("new sessions/s", f.Sessions.NewPerSec, 2)
	if s := f.Sessions; s.Current != 3 || s.Total != 9 || s.Hostile != 1 || s.Namespaces != 1 {
		t.Errorf("sessions %+v", s)
	}

	var buf bytes.Buffer
	if err := renderTopFrame(&buf, f); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"pid 42", "rates over 2s", "80.0%", "40.0", "host → nvme", "20ms", "20 MiB/s", "300", "400", "parked blocks 6", "3 current, 9 total (2.0 new/s), 1 closed as hostile"} {
		if !strings.Contains(out, want) {
			t.Errorf("frame lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a rendered frame has terminal control:\n%q", out)
	}

	// Counters that went backwards (never, short of a restart) do not wrap.
	backwards := *prev
	backwards.UptimeSeconds = cur.UptimeSeconds + 1
	back := computeTopFrame(cur, &backwards, time.Second, time.Unix(0, 0))
	if back.Tiers[0].Hits != 0 || *back.Ops[0].PerSec != 0 || back.Moves[0].Blocks != 0 {
		t.Errorf("backwards counters: %+v", back)
	}
}

func fmtPtr(p *float64) any {
	if p == nil {
		return "nil"
	}
	return *p
}

func TestComputeTopFrameWithoutRates(t *testing.T) {
	cur := &shm.Stats{PID: 7, Tiers: []shm.TierStats{{Name: "host", Hits: 5}}, Ops: map[string]uint64{"get": 3},
		Moves: []shm.MoveStats{{From: "host", To: "nvme", Blocks: 2}}}
	// No earlier sample, a restarted daemon, or no time between them.
	for _, prev := range []*shm.Stats{nil, {PID: 6, Ops: map[string]uint64{"get": 1}}} {
		f := computeTopFrame(prev, cur, time.Second, time.Now())
		if f.IntervalSeconds != 0 || f.OpsPerSec != nil || f.Ops[0].PerSec != nil || f.Tiers[0].HitsPerSec != nil ||
			f.Moves[0].BlocksPerSec != nil || f.Sessions.NewPerSec != nil || f.Ops[0].CountTotal != 3 || f.Moves[0].BlocksTotal != 2 {
			t.Errorf("prev %+v: frame %+v", prev, f)
		}
		var buf bytes.Buffer
		if err := renderTopFrame(&buf, f); err != nil || !strings.Contains(buf.String(), "no earlier sample") {
			t.Errorf("frame without rates: %v\n%s", err, buf.String())
		}
	}
	if f := computeTopFrame(cur, cur, 0, time.Now()); f.OpsPerSec != nil {
		t.Errorf("zero interval gave rates: %+v", f)
	}
}

func TestTopOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon")
	}
	sock := startDaemon(t, 128, false)
	s := putBlocks(t, sock, 1, 4)

	// Gets of the stored blocks while top samples: the interval must see
	// them as host hits and acquire ops.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		dst := make([]byte, 64<<10)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.Get(context.Background(), client.HashBlock(client.Hash{}, []uint32{1, uint32(i % 4)}), dst); err != nil {
				t.Errorf("get: %v", err)
				return
			}
		}
	}()
	out, err := run(t, "top", "--once", "--json", "--interval", "300ms", "--socket", sock)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	var f topFrame
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("top --once --json: %v\n%s", err, out)
	}
	if f.IntervalSeconds < 0.25 || f.IntervalSeconds > 3 {
		t.Errorf("interval %.3fs for --interval 300ms", f.IntervalSeconds)
	}
	if len(f.Tiers) != 1 || f.Tiers[0].Name != "host" || f.Tiers[0].Blocks != 4 || f.Tiers[0].HitsPerSec == nil || *f.Tiers[0].HitsPerSec <= 0 {
		t.Errorf("tiers %+v", f.Tiers)
	}
	// A Get is an acquire and a release on the ring.
	var acquires *float64
	for _, o := range f.Ops {
		if o.Op == "acquire" {
			acquires = o.PerSec
		}
	}
	if acquires == nil || *acquires <= 0 || f.OpsPerSec == nil || *f.OpsPerSec < *acquires || f.Sessions.Current < 1 {
		t.Fatalf("acquire/s %v, ops/s %v, sessions %+v", fmtPtr(acquires), fmtPtr(f.OpsPerSec), f.Sessions)
	}
	t.Logf("host hits %v/s, acquires %.0f/s over %.3fs", fmtPtr(f.Tiers[0].HitsPerSec), *acquires, f.IntervalSeconds)

	out = mustRun(t, "top", "--once", "--interval", "50ms", "--socket", sock)
	for _, want := range []string{"TIER", "host", "OPS/s", "acquire", "sessions", "parked blocks 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("top --once lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("top --once wrote terminal control:\n%q", out)
	}

	// plan takes the live daemon's tier sizes.
	r := planJSON(t, "--model", "llama-3-8b", "--concurrency", "64", "--avg-context", "8192", "--socket", sock)
	if len(r.Tiers) != 1 || r.Tiers[0].Name != "host" || r.Tiers[0].CapacityBytes != 128<<20 || r.Tiers[0].BlocksFit != 64 ||
		!strings.Contains(r.TierSource, sock) || r.ShortBytes != 64*gib-128*mib {
		t.Errorf("plan --socket: %+v", r)
	}

	for _, args := range [][]string{
		{"top", "--once", "--interval", "0s", "--socket", sock},
		{"top", "--once", "--socket", filepath.Join(t.TempDir(), "none.sock")},
	} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}

// A daemon restarted under the same pid (PID 1 of a container, or an
// in-process daemon) is a new process all the same: its counters start
// from zero, so a frame has no rates, as after a pid change. top told
// restarts by the pid alone and showed rates from the two daemons'
// counters (here 0 hits/s and 0 ops/s from a busy new daemon).
func TestComputeTopFrameSamePIDRestart(t *testing.T) {
	prev := &shm.Stats{PID: 1, UptimeSeconds: 3600, Tiers: []shm.TierStats{{Name: "host", Hits: 1000}},
		Ops: map[string]uint64{"get": 5000}, SessionsTotal: 50}
	cur := &shm.Stats{PID: 1, UptimeSeconds: 0.5, Tiers: []shm.TierStats{{Name: "host", Hits: 40}},
		Ops: map[string]uint64{"get": 100}, SessionsTotal: 2}
	f := computeTopFrame(prev, cur, time.Second, time.Now())
	if f.IntervalSeconds != 0 || f.OpsPerSec != nil || f.Tiers[0].HitsPerSec != nil || f.Sessions.NewPerSec != nil {
		t.Errorf("frame across a same-pid restart: interval %v, ops/s %v, hits/s %v, new sessions/s %v; want no rates",
			f.IntervalSeconds, fmtPtr(f.OpsPerSec), fmtPtr(f.Tiers[0].HitsPerSec), fmtPtr(f.Sessions.NewPerSec))
	}
	// The same daemon a second later still has rates, whatever the jitter
	// of the two samples.
	later := *prev
	later.UptimeSeconds += 1.3
	if f := computeTopFrame(prev, &later, time.Second, time.Now()); f.OpsPerSec == nil {
		t.Error("no rates between two samples of one daemon")
	}
}

// TestTopHitRatioAllBeforeAccess: a tier nothing has been looked up in yet
// shows "-" as its hit ratio since start, as status does; top printed
// 0.0%, a tier missing every access.
func TestTopHitRatioAllBeforeAccess(t *testing.T) {
	cur := &shm.Stats{
		Version: "v", PID: 42, UptimeSeconds: 12,
		Tiers: []shm.TierStats{
			{Name: "host", CapacityBytes: 1000, UsedBytes: 250},
			{Name: "nvme", CapacityBytes: 4000, Hits: 3, Misses: 1, HitRatio: 0.75},
		},
	}
	var buf bytes.Buffer
	if err := renderTopFrame(&buf, computeTopFrame(nil, cur, 0, time.Unix(0, 0))); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"host": "-", "nvme": "75.0%"}
	for _, line := range strings.Split(buf.String(), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || want[f[0]] == "" {
			continue
		}
		if got := f[len(f)-2]; got != want[f[0]] { // HIT% ALL, before EVICT/s
			t.Errorf("%s: HIT%% ALL %q, want %q in\n%s", f[0], got, want[f[0]], buf.String())
		}
		delete(want, f[0])
	}
	if len(want) > 0 {
		t.Errorf("no rows for %v in\n%s", want, buf.String())
	}
}
