package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseMix(t *testing.T) {
	tests := []struct {
		in      string
		want    mixWeights
		wantErr string
	}{
		{"put=1,get=1,lookup=0", mixWeights{1, 1, 0}, ""},
		{"put=1", mixWeights{Put: 1}, ""},
		{" GET = 3 , lookup=2 ", mixWeights{Get: 3, Lookup: 2}, ""},
		{"lookup=5,", mixWeights{Lookup: 5}, ""},
		{"put=0,get=0", mixWeights{}, "every weight is zero"},
		{"", mixWeights{}, "every weight is zero"},
		{"put", mixWeights{}, "not op=weight"},
		{"put=-1", mixWeights{}, "non-negative integer"},
		{"put=x", mixWeights{}, "non-negative integer"},
		{"put=1,put=2", mixWeights{}, "given twice"},
		{"delete=1", mixWeights{}, "unknown op"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseMix(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseMix(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("parseMix(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestMixPick(t *testing.T) {
	m := mixWeights{Put: 1, Get: 2, Lookup: 3}
	want := []opKind{opPut, opGet, opGet, opLookup, opLookup, opLookup}
	for r, k := range want {
		if got := m.pick(uint64(r)); got != k {
			t.Errorf("pick(%d) = %v, want %v", r, got, k)
		}
	}
}

func TestQuantile(t *testing.T) {
	seq := func(n int) []int64 {
		s := make([]int64, n)
		for i := range s {
			s[i] = int64(i + 1)
		}
		return s
	}
	tests := []struct {
		name    string
		samples []int64
		q       float64
		want    int64
	}{
		{"empty", nil, 0.5, 0},
		{"single", []int64{7}, 0.999, 7},
		{"p50 of 1..100", seq(100), 0.50, 50},
		{"p99 of 1..100", seq(100), 0.99, 99},
		{"p999 of 1..100 is the max", seq(100), 0.999, 100},
		{"p999 of 1..1000", seq(1000), 0.999, 999},
		{"p999 of 1..10000", seq(10000), 0.999, 9990},
		{"p0 is the min", seq(10), 0, 1},
		{"p100 is the max", seq(10), 1, 10},
		{"p50 of two", []int64{3, 9}, 0.5, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := quantile(tt.samples, tt.q); got != tt.want {
				t.Fatalf("quantile(%v) = %d, want %d", tt.q, got, tt.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	// Unsorted input in ns; summarize sorts and reports µs.
	l := summarize([]int64{4000, 1000, 3000, 2000})
	want := latency{Count: 4, MeanUS: 2.5, P50US: 2, P99US: 4, P999US: 4, MaxUS: 4}
	if l != want {
		t.Fatalf("summarize = %+v, want %+v", l, want)
	}
}

func TestByteSizeFlag(t *testing.T) {
	for in, want := range map[string]uint64{"2MiB": 2 << 20, "1MiB": 1 << 20, "4096": 4096, "1GiB": 1 << 30} {
		var b byteSize
		if err := b.Set(in); err != nil || uint64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"0", "2GiB", "lots"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) accepted %d", in, b)
		}
	}
}

func TestBenchNamespaceBlockBytes(t *testing.T) {
	for _, bs := range []uint64{1, 64, 4096, 1 << 20, 2 << 20, 3<<20 + 5} {
		ns := benchNamespace(bs)
		if ns.BlockBytes != bs {
			t.Fatalf("benchNamespace(%d).BlockBytes = %d", bs, ns.BlockBytes)
		}
		if err := ns.Validate(); err != nil {
			t.Fatalf("benchNamespace(%d): %v", bs, err)
		}
	}
	if err := lookupNamespace.Validate(); err != nil {
		t.Fatal(err)
	}
}

// run executes one kvtierctl command line and returns its stdout.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut) // not a terminal: no progress bar
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestUnreachableDaemon(t *testing.T) {
	_, err := run(t, "status", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if err == nil || !strings.Contains(err.Error(), "cannot reach kvtierd") {
		t.Fatalf("status against no daemon: %v", err)
	}
}

func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon and benches for ~3s")
	}
	sock := startDaemon(t, 128, false)

	out, err := run(t, "status", "--json", "--socket", sock)
	if err != nil {
		t.Fatal(err)
	}
	var st client.Stats
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if st.PID == 0 || len(st.Tiers) == 0 || st.Tiers[0].CapacityBytes != 128<<20 {
		t.Fatalf("status --json: implausible %+v", st)
	}

	out, err = run(t, "bench", "--json", "--socket", sock, "--mode", "putget", "--block-size", "1MiB", "--duration", "1s", "--warmup", "100ms")
	if err != nil {
		t.Fatal(err)
	}
	var res benchResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, out)
	}
	t.Logf("putget 1MiB: %.0f ops/s, %.2f GB/s, memcpy %.2f GB/s, ratio %.2f, put p50 %.1fµs",
		res.OpsPerSec, res.GBPerSec, res.Memcpy.GBPerSec, res.RatioToMemcpy, res.Latency["put"].P50US)
	switch {
	case res.BlockBytes != 1<<20 || res.Mode != modePutGet:
		t.Errorf("bench ran %s with %d-byte blocks", res.Mode, res.BlockBytes)
	case res.Ops == 0 || res.OpsPerSec <= 0 || res.GBPerSec <= 0:
		t.Errorf("no throughput: %+v", res)
	case res.GetMisses != 0 || res.GetHits*2 != res.Ops:
		t.Errorf("putget gets should all hit: %d hits, %d misses, %d ops", res.GetHits, res.GetMisses, res.Ops)
	case res.Memcpy == nil || res.Memcpy.GBPerSec <= 0 || res.RatioToMemcpy <= 0:
		t.Errorf("no memcpy baseline: %+v", res.Memcpy)
	case res.Latency["put"].P50US <= 0 || res.Latency["get"].P999US < res.Latency["get"].P50US:
		t.Errorf("implausible latencies: %+v", res.Latency)
	case res.Seconds < 0.9 || res.Seconds > 5:
		t.Errorf("measured %.2fs of a 1s run", res.Seconds)
	}

	// Human output of the other modes, briefly; the bench must leave the
	// tier as it found it.
	for _, mode := range []string{"nop", "lookup", "lookup-batch", "mix"} {
		out, err = run(t, "bench", "--socket", sock, "--mode", mode, "--block-size", "1MiB", "--duration", "200ms", "--warmup", "0s", "--sessions", "2", "--lookup-chain", "300")
		if err != nil {
			t.Fatalf("bench --mode %s: %v", mode, err)
		}
		if !strings.Contains(out, "ops/s") || !strings.Contains(out, "P99.9") {
			t.Errorf("bench --mode %s output:\n%s", mode, out)
		}
	}
	out, err = run(t, "status", "--socket", sock)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "kvtierctl-bench") {
		t.Errorf("status should list the bench namespace:\n%s", out)
	}
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--socket", sock)), &st); err != nil {
		t.Fatal(err)
	}
	if h := st.Tiers[0]; h.Blocks != 0 || h.Reserved != 0 || h.Leased != 0 {
		t.Errorf("bench left blocks behind: %+v", h)
	}

	out, err = run(t, "evict", "--all", "--socket", sock)
	if err != nil || !strings.Contains(out, "evicted 0 blocks") {
		t.Errorf("evict --all: %q, %v", out, err)
	}
	if _, err := run(t, "evict", "--socket", sock); err == nil {
		t.Error("evict without --namespace or --all succeeded")
	}
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startDaemon runs an in-process daemon with a host tier of hostMiB (16 MiB
// slabs) and, if nvme, a 256 MiB NVMe tier; it returns its socket.
func startDaemon(t *testing.T, hostMiB int, nvme bool) string {
	t.Helper()
	sock, _ := startDaemonIn(t, t.TempDir(), func(cfg *daemon.Config) {
		cfg.Host.SlabBytes = 16 << 20
		cfg.Host.Capacity = daemon.ByteSize(hostMiB) << 20
		cfg.NVMe.Enabled = nvme
		if nvme {
			cfg.NVMe.Capacity = 256 << 20
		}
	})
	return sock
}

// TestBenchKeysDefaultLeavesOthersRoom: bench's default working set is
// what fits in 80% of the host tier's free capacity (--keys help). It used
// to take min(80% of capacity, all free space): on a half-full tier the
// bench counted on every free byte, though the other client's slabs of
// another block size could lend it none, and the host tier evicted that
// client's blocks to make room.
func TestBenchKeysDefaultLeavesOthersRoom(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon and benches for ~3s (memcpy baselines included)")
	}
	sock := startDaemon(t, 128, false)
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns := benchNamespace(3 << 19)
	ns.ModelID = "another-model"
	s, err := c.Open(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	// Another client's 40 blocks of 1.5 MiB: four 16 MiB slabs of ten
	// slots each (1 MiB of each slab holds no slot), about half the tier.
	hs := make([]client.Hash, 40)
	blk := make([]byte, 3<<19)
	for i := range hs {
		hs[i] = client.Hash{Hi: 0xbe, Lo: uint64(i)}
		if _, err := s.Put(ctx, hs[i], blk); err != nil {
			t.Fatal(err)
		}
	}
	var st client.Stats
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--socket", sock)), &st); err != nil {
		t.Fatal(err)
	}
	h := st.Tiers[0]
	want := int((h.CapacityBytes - h.UsedBytes) * 8 / 10 / (1 << 20))

	out := mustRun(t, "bench", "--json", "--socket", sock, "--block-size", "1MiB", "--duration", "300ms", "--warmup", "0s")
	var res benchResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, out)
	}
	if res.Keys != want {
		t.Errorf("bench working set %d blocks on a tier with %d of %d bytes used, want %d (80%% of the free space)",
			res.Keys, h.UsedBytes, h.CapacityBytes, want)
	}
	lr, err := s.Lookup(ctx, hs)
	if err != nil {
		t.Fatal(err)
	}
	inHost := 0
	for _, tier := range lr.Tiers {
		if tier == client.TierHost {
			inHost++
		}
	}
	if lr.Hits != len(hs) || inHost != len(hs) || res.Evictions != 0 || res.PutFull != 0 {
		t.Errorf("after the bench %d of the other client's %d blocks are cached (%d in the host tier); %d evictions, %d puts refused",
			lr.Hits, len(hs), inHost, res.Evictions, res.PutFull)
	}
}
