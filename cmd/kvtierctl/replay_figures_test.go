package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
)

// handTrace is a trace whose every figure is known by hand (see
// TestReplayFiguresByHand).
var handTrace = []trace.Request{
	{Timestamp: 0, InputLength: 1000, HashIDs: []int64{1, 2}}, // cold: 0 hits, 2 puts
	{Timestamp: 1, InputLength: 700, HashIDs: []int64{1, 3}},  // 1 hit (512 tokens), 1 put
	{Timestamp: 2, InputLength: 1000, HashIDs: []int64{1, 2}}, // 2 hits (all 1000 tokens)
	{Timestamp: 3, InputLength: 300, HashIDs: []int64{4}},     // cold: 1 put
	{Timestamp: 4, InputLength: 0, HashIDs: []int64{}},        // nothing to look up
}

// TestReplayFiguresByHand checks every figure of a live replay and of
// --simulate on handTrace against values computed by hand.
func TestReplayFiguresByHand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon")
	}
	sock := startDaemon(t, 64, false)
	path := writeTrace(t, handTrace)
	const block = 16 << 10
	res := replayJSON(t, "--socket", sock, "--block-size", "16KiB", "--fresh", path)
	type fig struct {
		name      string
		got, want any
	}
	for _, f := range []fig{
		{"requests", res.Requests, 5},
		{"block_refs", res.BlockRefs, uint64(7)},
		{"distinct_blocks", res.DistinctBlocks, 4},
		{"prompt_tokens", res.PromptTokens, uint64(3000)},
		{"tokens_served", res.TokensServed, uint64(512 + 1000)},
		{"prefix_hit_ratio", res.PrefixHitRatio, 1512.0 / 3000},
		{"block_hit_ratio", res.BlockHitRatio, 3.0 / 7},
		{"get_blocks", res.GetBlocks, uint64(3)},
		{"put_blocks", res.PutBlocks, uint64(4)},
		{"put_stored", res.PutStored, uint64(4)},
		{"bytes_put", res.BytesIn, uint64(4 * block)},
		{"bytes_got", res.BytesOut, uint64(3 * block)},
		{"lookups", res.Latency["lookup"].Count, 4},
		{"gets", res.Latency["get"].Count, 2},
		{"puts", res.Latency["put"].Count, 3},
	} {
		if f.got != f.want {
			t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
		}
	}
	for _, h := range res.BlockHits {
		want := uint64(0)
		if h.Tier == "host" {
			want = 3
		}
		if h.Blocks != want || h.Ratio != float64(want)/7 {
			t.Errorf("hits in %s: %d blocks, ratio %v; want %d, %v", h.Tier, h.Blocks, h.Ratio, want, float64(want)/7)
		}
	}
	for _, m := range res.Moves {
		if m.Blocks != 0 || m.Bytes != 0 {
			t.Errorf("moved %s→%s: %d blocks, %d bytes; want none (no NVMe tier)", m.From, m.To, m.Blocks, m.Bytes)
		}
	}

	out := mustRun(t, "replay", "--simulate", "--json", "--capacity-blocks", "0,2", "--policy", "lru", path)
	var sim simResult
	if err := json.Unmarshal([]byte(out), &sim); err != nil {
		t.Fatalf("replay --simulate --json: %v\n%s", err, out)
	}
	if sim.BlockRefs != 7 || sim.DistinctBlocks != 4 || sim.UnlimitedHit != 3.0/7 {
		t.Errorf("simulate: %d refs, %d distinct, unlimited hit %v; want 7, 4, %v", sim.BlockRefs, sim.DistinctBlocks, sim.UnlimitedHit, 3.0/7)
	}
	if got := sim.Capacities[0].LRU; got != res.BlockHitRatio {
		t.Errorf("simulated unlimited LRU hit %v, live replay's block hit %v: they should agree", got, res.BlockHitRatio)
	}
	// Two blocks of LRU: request 2 finds 1 (then 3 evicts 2), request 3
	// finds 1, misses 2: 2 hits of 7.
	if got := sim.Capacities[1].LRU; got != 2.0/7 {
		t.Errorf("simulated 2-block LRU hit %v, want %v", got, 2.0/7)
	}
}

// A trace line without input_length (a trace of block ids only) had 0
// prompt tokens: replay printed a prefix hit ratio of 0% ("0 of 0 prompt
// tokens") beside a 50% block hit ratio. Its blocks are now its prompt; a
// line whose blocks outrun its input_length is refused, naming the line.
func TestReplayPrefixHitWithoutInputLength(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon")
	}
	sock := startDaemon(t, 64, false)
	path := filepath.Join(t.TempDir(), "ids.jsonl")
	data := "{\"timestamp\": 0, \"hash_ids\": [1, 2]}\n{\"timestamp\": 1, \"hash_ids\": [1, 2]}\n"
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	res := replayJSON(t, "--socket", sock, "--block-size", "16KiB", "--fresh", path)
	if res.BlockHitRatio != 0.5 || res.PromptTokens != 2048 || res.TokensServed != 1024 || res.PrefixHitRatio != 0.5 {
		t.Errorf("block hit %v; prefix hit %v (%d of %d tokens); want 0.5; 0.5 (1024 of 2048)",
			res.BlockHitRatio, res.PrefixHitRatio, res.TokensServed, res.PromptTokens)
	}
	bad := filepath.Join(t.TempDir(), "short.jsonl")
	data = "{\"timestamp\": 0, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n{\"timestamp\": 1, \"input_length\": 100, \"hash_ids\": [1, 2, 3]}\n"
	if err := os.WriteFile(bad, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "replay", "--socket", sock, "--block-size", "16KiB", "--fresh", bad); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("replay of a line with 3 blocks in 100 tokens: %v; want an error at line 2", err)
	}
}
