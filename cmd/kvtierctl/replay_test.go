package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/tiers/policy"
	"github.com/kvtier/kvtier/tiers/trace"
)

// writeTrace writes reqs as a trace file in a temp dir.
func writeTrace(t *testing.T, reqs []trace.Request) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := trace.Write(f, reqs); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReplayPayload(t *testing.T) {
	a, b := make([]byte, 4099), make([]byte, 4099)
	h := client.Hash{Hi: 1, Lo: 2}
	replayPayload(a, h)
	replayPayload(b, h)
	if string(a) != string(b) {
		t.Fatal("payload is not deterministic")
	}
	for _, other := range []client.Hash{{Hi: 1, Lo: 3}, {Hi: 2, Lo: 2}, {Hi: 2, Lo: 1}} {
		replayPayload(b, other)
		if string(a[:8]) == string(b[:8]) || string(a[4096:]) == string(b[4096:]) {
			t.Fatalf("payloads of %v and %v collide", h, other)
		}
	}
}

func TestSimPolicies(t *testing.T) {
	got, err := simPolicies([]string{"chain", "LRU", "belady", "chain"})
	if err != nil || strings.Join(got, ",") != "lru,chain" {
		t.Fatalf("simPolicies = %v, %v; want lru,chain", got, err)
	}
	all, err := simPolicies([]string{"all"})
	if err != nil || all[0] != "lru" || len(all) != len(policy.Names()) {
		t.Fatalf("simPolicies(all) = %v, %v", all, err)
	}
	if _, err := simPolicies([]string{"nope"}); err == nil || !strings.Contains(err.Error(), "unknown --policy") {
		t.Fatalf("unknown policy: %v", err)
	}
}

func TestReplaySimulate(t *testing.T) {
	path := writeTrace(t, trace.Mixed(7, 1500))
	caps := "50,300,2000"

	out := mustRun(t, "replay", "--simulate", "--json", "--capacity-blocks", caps, "--policy", "all", path)
	var res simResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("replay --simulate --json: %v\n%s", err, out)
	}
	if res.Requests != 1500 || res.BlockRefs == 0 || res.DistinctBlocks == 0 || res.Trace != path {
		t.Fatalf("implausible header: %+v", res)
	}
	if len(res.Capacities) != 3 {
		t.Fatalf("%d capacities, want 3", len(res.Capacities))
	}
	prevLRU := -1.0
	for i, c := range res.Capacities {
		if want := []int{50, 300, 2000}[i]; c.CapacityBlocks != want {
			t.Fatalf("capacity %d = %d, want %d", i, c.CapacityBlocks, want)
		}
		if len(c.Policies) != len(policy.Names()) || c.Policies[0].Policy != "lru" {
			t.Fatalf("capacity %d: policies %+v, want all with lru first", c.CapacityBlocks, c.Policies)
		}
		if c.LRU != c.Policies[0].HitRatio {
			t.Errorf("capacity %d: lru_hit_ratio %v differs from the lru row %v", c.CapacityBlocks, c.LRU, c.Policies[0].HitRatio)
		}
		if c.LRU > c.Belady+1e-12 {
			t.Errorf("capacity %d: LRU %.4f above Belady %.4f", c.CapacityBlocks, c.LRU, c.Belady)
		}
		if c.Belady > res.UnlimitedHit+1e-12 {
			t.Errorf("capacity %d: Belady %.4f above the unlimited cache's %.4f", c.CapacityBlocks, c.Belady, res.UnlimitedHit)
		}
		if c.LRU < prevLRU {
			t.Errorf("LRU not monotone in capacity: %.4f after %.4f", c.LRU, prevLRU)
		}
		prevLRU = c.LRU
		defaults := 0
		for _, p := range c.Policies {
			if p.HitRatio < 0 || p.HitRatio > c.Belady+1e-9 {
				t.Errorf("capacity %d: %s hit %.4f outside [0, Belady %.4f]", c.CapacityBlocks, p.Policy, p.HitRatio, c.Belady)
			}
			if p.Default {
				defaults++
			}
			if c.Belady > c.LRU {
				if p.GapClosed == nil {
					t.Errorf("capacity %d: %s has no gap_closed", c.CapacityBlocks, p.Policy)
				} else if want := (p.HitRatio - c.LRU) / (c.Belady - c.LRU); *p.GapClosed != want {
					t.Errorf("capacity %d: %s gap_closed %v, want %v", c.CapacityBlocks, p.Policy, *p.GapClosed, want)
				}
			}
		}
		if defaults != 1 {
			t.Errorf("capacity %d: %d policies marked default", c.CapacityBlocks, defaults)
		}
	}
	if res.Capacities[0].Belady <= res.Capacities[0].LRU {
		t.Errorf("a 50-block cache should leave LRU a gap to Belady: %+v", res.Capacities[0])
	}

	// Table: a header, one row per policy per capacity plus Belady's.
	out = mustRun(t, "replay", "--simulate", "--capacity-blocks", caps, path)
	for _, want := range []string{"CAPACITY", "POLICY", "HIT RATIO", "GAP CLOSED", "belady (MIN)", "lru", policy.Default + " (default)", "2000", "1500 requests"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "belady (MIN)"); n != 3 {
		t.Errorf("table has %d Belady rows, want 3:\n%s", n, out)
	}

	// --limit and flag errors.
	if err := json.Unmarshal([]byte(mustRun(t, "replay", "--simulate", "--json", "--limit", "10", path)), &res); err != nil || res.Requests != 10 {
		t.Errorf("--limit 10: %d requests, %v", res.Requests, err)
	}
	for _, args := range [][]string{
		{"replay", "--simulate", "--policy", "nope", path},
		{"replay", "--simulate", "--capacity-blocks", "-1", path},
		{"replay", "--simulate", "--sessions", "2", path},
		{"replay", "--capacity-blocks", "10", path},
		{"replay", "--fresh", "--seed", "3", path},
		{"replay", "--simulate", filepath.Join(t.TempDir(), "missing.jsonl")},
		{"replay", "--simulate"},
	} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}

func replayJSON(t *testing.T, args ...string) replayResult {
	t.Helper()
	out := mustRun(t, append([]string{"replay", "--json"}, args...)...)
	var res replayResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("replay --json: %v\n%s", err, out)
	}
	return res
}

func TestReplayLive(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon")
	}
	sock := startDaemon(t, 128, false)
	// 400 chat requests: about 1,800 distinct blocks of 16 KiB = 28 MiB,
	// well inside the host tier.
	reqs := trace.Chat(3, 400)
	ts := trace.Summarize(reqs)
	path := writeTrace(t, reqs)
	args := []string{"--socket", sock, "--block-size", "16KiB", "--sessions", "3", "--seed", "77", path}

	first := replayJSON(t, args...)
	second := replayJSON(t, args...)
	t.Logf("first pass: block hit %.3f, prefix hit %.3f; second: %.3f, %.3f; lookup p50 %.1fµs",
		first.BlockHitRatio, first.PrefixHitRatio, second.BlockHitRatio, second.PrefixHitRatio, second.Latency["lookup"].P50US)
	for i, res := range []replayResult{first, second} {
		switch {
		case res.Requests != len(reqs) || res.BlockRefs != uint64(ts.BlockRefs) || res.DistinctBlocks != ts.DistinctBlocks:
			t.Errorf("pass %d: %d requests, %d refs, %d distinct; want %d, %d, %d", i+1,
				res.Requests, res.BlockRefs, res.DistinctBlocks, len(reqs), ts.BlockRefs, ts.DistinctBlocks)
		case res.VerifyFailures != 0 || res.GetMisses != 0:
			t.Errorf("pass %d: %d verification failures, %d get misses", i+1, res.VerifyFailures, res.GetMisses)
		case res.Seed != "0x4d" || res.BlockBytes != 16<<10 || res.Sessions != 3:
			t.Errorf("pass %d: seed %s, block %d, sessions %d", i+1, res.Seed, res.BlockBytes, res.Sessions)
		case res.Latency["lookup"].Count != len(reqs) || res.Latency["lookup"].P50US <= 0:
			t.Errorf("pass %d: lookup latency %+v", i+1, res.Latency["lookup"])
		case len(res.BlockHits) < 2 || res.BlockHits[0].Tier != "host":
			t.Errorf("pass %d: block hits %+v", i+1, res.BlockHits)
		case res.BlockHits[0].Blocks != res.GetBlocks:
			t.Errorf("pass %d: %d host hits but %d blocks got (no NVMe tier)", i+1, res.BlockHits[0].Blocks, res.GetBlocks)
		case res.PrefixHitRatio < 0 || res.PrefixHitRatio > 1:
			t.Errorf("pass %d: prefix hit ratio %v", i+1, res.PrefixHitRatio)
		}
	}
	// The first pass sees a cold cache, bar within-trace reuse (sessions
	// may reorder requests a little); the second finds everything.
	if first.BlockHitRatio > ts.InfiniteHit+0.05 {
		t.Errorf("first pass block hit %.3f above the trace's unlimited-cache %.3f", first.BlockHitRatio, ts.InfiniteHit)
	}
	if first.PutStored == 0 || first.BytesIn != first.PutStored*16<<10 {
		t.Errorf("first pass stored %d blocks, %d bytes", first.PutStored, first.BytesIn)
	}
	if second.BlockHitRatio <= first.BlockHitRatio || second.BlockHitRatio < 0.999 || second.PrefixHitRatio < 0.999 {
		t.Errorf("second pass: block hit %.4f, prefix hit %.4f; first %.4f: want ~1", second.BlockHitRatio, second.PrefixHitRatio, first.BlockHitRatio)
	}
	if second.PutStored != 0 || second.Latency["get"].Count == 0 {
		t.Errorf("second pass stored %d blocks, %d gets", second.PutStored, second.Latency["get"].Count)
	}
	for i, res := range []replayResult{first, second} {
		// Every request's get is also a get-host or a get-nvme.
		if g, h, n := res.Latency["get"].Count, res.Latency["get-host"].Count, res.Latency["get-nvme"].Count; g == 0 || h+n != g {
			t.Errorf("pass %d: %d gets, %d get-host + %d get-nvme", i+1, g, h, n)
		}
	}

	// A fresh seed starts cold again; --limit and the table.
	fresh := replayJSON(t, "--socket", sock, "--block-size", "16KiB", "--fresh", "--limit", "50", path)
	if fresh.Requests != 50 || fresh.Seed == "0x4d" || fresh.BlockHitRatio > 0.9 {
		t.Errorf("--fresh --limit 50: %d requests, seed %s, hit %.3f", fresh.Requests, fresh.Seed, fresh.BlockHitRatio)
	}
	out := mustRun(t, "replay", "--socket", sock, "--block-size", "16KiB", "--seed", "0x4d", "--limit", "20", "--speed", "1000", path)
	for _, want := range []string{"20 requests", "hit in host", "prefix hit ratio", "failed verification", "FROM", "nvme", "OP", "P99.9", "lookup", "get", "get-host"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if _, err := run(t, "replay", "--socket", filepath.Join(t.TempDir(), "none.sock"), path); err == nil || !strings.Contains(err.Error(), "cannot reach kvtierd") {
		t.Errorf("replay against no daemon: %v", err)
	}
}

// TestReplayLiveNVMe overflows a small host tier so the mover demotes
// blocks: a second pass finds some of them in NVMe, byte-exact.
func TestReplayLiveNVMe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon with an NVMe tier")
	}
	sock := startDaemon(t, 32, true)
	// Docs: shared documents of 16 blocks (median) from a catalogue of 2,000:
	// far more than the 512 blocks of 64 KiB that fit in 32 MiB.
	reqs := trace.Docs(5, 100)
	path := writeTrace(t, reqs)
	args := []string{"--socket", sock, "--block-size", "64KiB", "--seed", "9", path}
	first := replayJSON(t, args...)
	second := replayJSON(t, args...)
	var demoted uint64
	for _, m := range append(first.Moves, second.Moves...) {
		if m.From == "host" && m.To == "nvme" {
			demoted += m.Blocks
		}
	}
	var nvmeHits uint64
	for _, h := range second.BlockHits {
		if h.Tier == "nvme" {
			nvmeHits = h.Blocks
		}
	}
	t.Logf("first: hit %.3f; second: hit %.3f (%d from nvme); demoted %d; moves %+v",
		first.BlockHitRatio, second.BlockHitRatio, nvmeHits, demoted, second.Moves)
	if first.VerifyFailures+second.VerifyFailures != 0 {
		t.Errorf("verification failures: %d, %d", first.VerifyFailures, second.VerifyFailures)
	}
	if demoted == 0 || nvmeHits == 0 {
		t.Errorf("no host→nvme traffic (%d demoted, %d nvme hits)", demoted, nvmeHits)
	}
	if second.BlockHitRatio <= first.BlockHitRatio {
		t.Errorf("second pass hit %.3f not above first %.3f", second.BlockHitRatio, first.BlockHitRatio)
	}
}

// --limit N replays only the first N requests; a bad line after them is not
// part of the replay and must not fail it (replay used to read and validate
// the whole file first).
func TestReplayLimitStopsReading(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	data := `{"timestamp": 0, "input_length": 1024, "hash_ids": [1, 2]}
{"timestamp": 5, "input_length": 1024, "hash_ids": [1, 3]}
{"timestamp": 9, "input_length": 512, "hash_ids": [1, 1]}
not json
`
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	var res simResult
	out := mustRun(t, "replay", "--simulate", "--json", "--limit", "2", "--capacity-blocks", "0", path)
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("replay --simulate --json: %v\n%s", err, out)
	}
	// Two requests, four references, one hit (block 1 of the second).
	if res.Requests != 2 || res.BlockRefs != 4 || res.DistinctBlocks != 3 || res.UnlimitedHit != 0.25 {
		t.Errorf("--limit 2: %d requests, %d refs, %d distinct, unlimited hit %v; want 2, 4, 3, 0.25",
			res.Requests, res.BlockRefs, res.DistinctBlocks, res.UnlimitedHit)
	}
	// Without --limit the bad lines still fail the replay, naming the line.
	if _, err := run(t, "replay", "--simulate", "--limit", "3", path); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("--limit 3 over a bad line 3: %v", err)
	}
}
