package main

// kvtierctl against a daemon that dies or restarts mid-command, and
// inputs at the edges.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
	"github.com/kvtier/kvtier/tiers/trace"
)

// restartableDaemon runs an in-process daemon (host tier of hostMiB, no NVMe) in
// dir and returns its socket and a func that stops it (idempotent). Two
// daemons started on the same dir one after the other share the socket: a
// restart.
func restartableDaemon(t *testing.T, dir string, hostMiB int) (string, func()) {
	t.Helper()
	return startDaemonIn(t, dir, func(cfg *daemon.Config) {
		cfg.NVMe.Enabled = false
		cfg.Host.SlabBytes = 16 << 20
		cfg.Host.Capacity = daemon.ByteSize(hostMiB) << 20
	})
}

// startDaemonIn is restartableDaemon with the config (defaults, no metrics
// endpoint, runtime and state under dir) set by set.
func startDaemonIn(t *testing.T, dir string, set func(*daemon.Config)) (string, func()) {
	t.Helper()
	args := []string{"-runtime-dir", dir, "-state-dir", filepath.Join(dir, "state"), "-host-capacity", "128MiB", "-metrics-listen", ""}
	cfg, err := daemon.LoadFromArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	set(&cfg)
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	}
	t.Cleanup(stop)
	return cfg.Socket, stop
}

// runCtx executes one kvtierctl command line under ctx.
func runCtx(ctx context.Context, args ...string) (string, string, error) {
	var out, errOut bytes.Buffer
	cmd := newRootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err := cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// top --json promises one JSON object per line on stdout. When the daemon
// goes away mid-run, top keeps watching, but writes its error as plain text
// into the same stream, so a consumer of the JSON lines breaks.
func TestTopJSONStaysJSONWhenDaemonDies(t *testing.T) {
	sock, stop := restartableDaemon(t, t.TempDir(), 64)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		out, errOut string
		err         error
	}
	done := make(chan result, 1)
	go func() {
		out, errOut, err := runCtx(ctx, "top", "--json", "--interval", "50ms", "--socket", sock)
		done <- result{out, errOut, err}
	}()
	time.Sleep(300 * time.Millisecond) // a few frames
	stop()                             // the daemon dies
	time.Sleep(300 * time.Millisecond) // a few failed samples
	cancel()                           // Ctrl-C
	r := <-done
	if r.err != nil {
		t.Fatalf("top after Ctrl-C: %v", r.err)
	}
	frames := 0
	for i, line := range strings.Split(strings.TrimSpace(r.out), "\n") {
		var f topFrame
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Errorf("stdout line %d of top --json is not JSON (%v): %q", i+1, err, line)
			continue
		}
		frames++
	}
	if frames == 0 {
		t.Errorf("no JSON frame at all:\n%s", r.out)
	}
}

// An interrupted replay with several sessions reports distinct_blocks of
// the first `requests` requests of the trace, not of the requests that
// completed: sessions run their shares independently, so those differ.
func TestReplayInterruptedDistinctBlocks(t *testing.T) {
	sock, _ := restartableDaemon(t, t.TempDir(), 64)
	// Sessions: requests 0 and 2 go to session 0, 1 and 3 to session 1
	// (round-robin). Request 2 is due 10 minutes in, so at the interrupt
	// requests 0, 1 and 3 have completed (blocks 1, 2, 6), not 0, 1 and 2.
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 512, HashIDs: []int64{1}},
		{Timestamp: 0, InputLength: 512, HashIDs: []int64{2}},
		{Timestamp: 600000, InputLength: 1536, HashIDs: []int64{3, 4, 5}},
		{Timestamp: 10, InputLength: 512, HashIDs: []int64{6}},
	}
	path := writeTrace(t, reqs)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond) // the "Ctrl-C"
	defer cancel()
	out, _, err := runCtx(ctx, "replay", "--json", "--socket", sock, "--block-size", "16KiB", "--fresh",
		"--sessions", "2", "--speed", "1", path)
	if err == nil {
		t.Fatal("interrupted replay exited 0")
	}
	var res replayResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("replay --json: %v\n%s", err, out)
	}
	if !res.Interrupted || res.Requests != 3 || res.BlockRefs != 3 {
		t.Fatalf("interrupted %v, %d requests, %d block refs; want true, 3, 3", res.Interrupted, res.Requests, res.BlockRefs)
	}
	if res.DistinctBlocks != 3 {
		t.Errorf("distinct_blocks = %d for the 3 completed requests (blocks 1, 2, 6); want 3", res.DistinctBlocks)
	}
}

// A replay survives a daemon restart between requests (its sessions
// reconnect), but its daemon-wide deltas subtract the old daemon's counters
// from the new one's: unsigned wrap-around to ~1.8e19.
func TestReplayAcrossDaemonRestart(t *testing.T) {
	dir := t.TempDir()
	sock, stopA := restartableDaemon(t, dir, 16)
	// 400 blocks of 64 KiB into a 16 MiB host tier (one slab): the daemon
	// evicts, so its eviction counter is well above 0.
	s := putBlocks(t, sock, 7, 400)
	_ = s
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 512, HashIDs: []int64{1}},
		{Timestamp: 2000, InputLength: 512, HashIDs: []int64{2}},
	}
	path := writeTrace(t, reqs)
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, _, err := runCtx(context.Background(), "replay", "--json", "--socket", sock, "--block-size", "16KiB",
			"--fresh", "--speed", "1", path)
		done <- result{out, err}
	}()
	time.Sleep(700 * time.Millisecond) // first request done, second due at 2s
	stopA()
	restartableDaemon(t, dir, 16) // the daemon restarts on the same socket
	r := <-done
	if r.err != nil {
		t.Skipf("replay did not survive the restart: %v", r.err)
	}
	var res replayResult
	if err := json.Unmarshal([]byte(r.out), &res); err != nil {
		t.Fatalf("replay --json: %v\n%s", err, r.out)
	}
	if res.Requests != 2 {
		t.Fatalf("%d requests", res.Requests)
	}
	for tier, n := range res.Evictions {
		if n > 1<<40 {
			t.Errorf("evictions during the run in %s = %d: a wrapped difference of two daemons' counters", tier, n)
		}
	}
	for _, m := range res.Moves {
		if m.Blocks > 1<<40 || m.Bytes > 1<<50 {
			t.Errorf("move %+v: wrapped", m)
		}
	}
}

// replay --simulate with a --capacity-blocks far beyond the trace's size
// must answer (such a cache never evicts: it is the unlimited one) or refuse
// with an error; the policies preallocate per block of capacity, so kvtierctl
// panics instead (makeslice: len out of range), killing the process with a
// stack trace. The command runs in a child process so that the panic shows
// as this test's failure.
func TestSimulateHugeCapacity(t *testing.T) {
	if os.Getenv("KVTIER_TEST_SIM_CHILD") != "" {
		_, err := run(t, "replay", "--simulate", "--json", "--capacity-blocks", os.Getenv("KVTIER_TEST_SIM_CHILD"), os.Getenv("KVTIER_TEST_SIM_TRACE"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "clean error:", err)
		}
		return
	}
	path := writeTrace(t, trace.Chat(1, 20))
	cmd := exec.Command(os.Args[0], "-test.run=^TestSimulateHugeCapacity$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVTIER_TEST_SIM_CHILD=4611686018427387904", "KVTIER_TEST_SIM_TRACE="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		lines := strings.SplitN(string(out), "\n", 6)
		t.Fatalf("replay --simulate --capacity-blocks 2^62: child died (%v):\n%s", err, strings.Join(lines[:min(len(lines), 5)], "\n"))
	}
}

// A replay interrupted while a request is in flight reports the requests
// completed so far ("figures cover the requests completed so far"), but the
// in-flight request's blocks and prompt tokens were counted when it
// started: block_refs and prompt_tokens (the prefix hit ratio's
// denominator) include a request that is not in `requests`.
func TestReplayInterruptedMidRequest(t *testing.T) {
	sock, _ := restartableDaemon(t, t.TempDir(), 256)
	// Request 1 puts 40,000 blocks of 4 KiB in 625 batches: the interrupt
	// lands while it is in flight.
	const n = 40000
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 512, HashIDs: []int64{0}},
		{Timestamp: 0, InputLength: n * trace.BlockTokens, HashIDs: ids},
	}
	path := writeTrace(t, reqs)
	c, err := client.Dial(context.Background(), client.Options{Socket: sock, Name: "kvtierctl-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, _, err := runCtx(ctx, "replay", "--json", "--socket", sock, "--block-size", "4KiB", "--fresh", path)
		done <- result{out, err}
	}()
	// The "Ctrl-C": once request 1 has stored a few thousand blocks.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if h := hostTier(st); h != nil && h.Blocks > 2000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("request 1 stored no blocks within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	r := <-done
	if r.err == nil {
		t.Skip("request 1 completed before the interrupt")
	}
	var res replayResult
	if err := json.Unmarshal([]byte(r.out), &res); err != nil {
		t.Fatalf("replay --json: %v (%v)\n%s", err, r.err, r.out)
	}
	if !res.Interrupted || res.Requests != 1 {
		t.Fatalf("interrupted %v, %d requests; want true, 1", res.Interrupted, res.Requests)
	}
	if res.BlockRefs != 1 || res.PromptTokens != 512 || res.DistinctBlocks != 1 {
		t.Errorf("1 completed request (1 block, 512 tokens): block_refs %d, prompt_tokens %d, distinct_blocks %d; want 1, 512, 1",
			res.BlockRefs, res.PromptTokens, res.DistinctBlocks)
	}
	if res.PutBlocks != 1 || res.Latency["lookup"].Count != 1 {
		t.Errorf("1 completed request: put_blocks %d, %d lookups; want 1, 1", res.PutBlocks, res.Latency["lookup"].Count)
	}
}

// kvtierctl catches SIGINT and SIGTERM (main's signal.NotifyContext) so that
// a bench or a live replay stops cleanly; replay --simulate never looked at
// that context, so Ctrl-C (and kill) did nothing until every simulation had
// run, minutes on a large trace.
func TestReplaySimulateInterrupt(t *testing.T) {
	path := writeTrace(t, trace.Mixed(7, 4000))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := runCtx(ctx, "replay", "--simulate", "--policy", "all", "--capacity-blocks", "500,2000,8000", path)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the simulations are under way
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("replay --simulate interrupted: %v; want context.Canceled", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("replay --simulate still running 3s after the interrupt")
	}
}

// --speed must be a finite number ≥ 0. NaN and ±Inf passed the "< 0"
// check: the replay ran (NaN as fast as possible) and --json then failed on
// the unencodable speed, after the blocks were stored. A tiny positive
// speed (slow motion) made the delay overflow time.Duration: it wrapped
// negative and the requests ran at once, as fast as possible.
func TestReplaySpeedEdges(t *testing.T) {
	sock, _ := restartableDaemon(t, t.TempDir(), 64)
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 512, HashIDs: []int64{1}},
		{Timestamp: 1000, InputLength: 512, HashIDs: []int64{2}},
	}
	path := writeTrace(t, reqs)
	for _, speed := range []string{"NaN", "Inf", "-Inf"} {
		_, _, err := runCtx(context.Background(), "replay", "--json", "--socket", sock, "--block-size", "16KiB", "--fresh", "--speed", speed, path)
		if err == nil || !strings.Contains(err.Error(), "--speed") {
			t.Errorf("--speed %s: %v; want an error about --speed", speed, err)
		}
	}

	// 1000 ms at speed 1e-12 is 1e21 ns (about 31,700 years): request 2
	// waits until the interrupt.
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	out, _, err := runCtx(ctx, "replay", "--json", "--socket", sock, "--block-size", "16KiB", "--fresh", "--speed", "1e-12", path)
	var res replayResult
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil {
		t.Fatalf("replay --json: %v (%v)\n%s", jerr, err, out)
	}
	if err == nil || !res.Interrupted || res.Requests != 1 {
		t.Errorf("--speed 1e-12: %v, interrupted %v, %d requests; want the interrupt after request 1", err, res.Interrupted, res.Requests)
	}
}

// The prefix hit ratio is tokens served / prompt tokens, summed in uint64.
// A trace line may claim any int input_length: four lines of 2^62 tokens
// wrapped the sum to 0, and the replay printed a prefix hit ratio of 200%
// (2048 tokens served of 1024). Such lengths are refused as bad input.
func TestReplayHugeInputLength(t *testing.T) {
	sock, _ := restartableDaemon(t, t.TempDir(), 64)
	const huge = 1 << 62
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: huge, HashIDs: []int64{1}},
		{Timestamp: 1, InputLength: huge, HashIDs: []int64{1}},
		{Timestamp: 2, InputLength: huge, HashIDs: []int64{1}},
		{Timestamp: 3, InputLength: huge, HashIDs: []int64{1}},
		{Timestamp: 4, InputLength: 1024, HashIDs: []int64{1, 2}},
	}
	path := writeTrace(t, reqs)
	out, _, err := runCtx(context.Background(), "replay", "--json", "--socket", sock, "--block-size", "16KiB", "--fresh", path)
	if err != nil {
		if !strings.Contains(err.Error(), "line 1") || !strings.Contains(err.Error(), "input_length") {
			t.Errorf("replay refused the trace with %v; want an input_length error at line 1", err)
		}
		return
	}
	var res replayResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("replay --json: %v\n%s", err, out)
	}
	t.Errorf("replay accepted input_length 2^62: prefix hit ratio %.2f (%d of %d prompt tokens)",
		res.PrefixHitRatio, res.TokensServed, res.PromptTokens)
}

// A replay's daemon-wide figures (evictions, moves) are differences of the
// daemon's counters before and after the run; when the daemon restarted
// during the run they are the new daemon's counters. The restart was told
// by a change of pid alone, which a daemon restarted under the same pid (PID
// 1 in a container; here, in-process) does not show: the replay printed the
// new daemon's evictions minus the old one's.
func TestReplayAcrossSamePIDRestart(t *testing.T) {
	// The restart follows the commit of request 1 as the daemon counts it;
	// rarely the client has not read that commit's completion yet and
	// request 1 fails on the lost connection. That is not the property
	// under test: try again.
	for attempt := 1; ; attempt++ {
		res, evA, evB, err := replayAcrossSamePIDRestart(t)
		if err != nil && attempt < 3 && strings.Contains(err.Error(), "request 0 (line 1)") {
			t.Logf("attempt %d: %v", attempt, err)
			continue
		}
		if err != nil {
			t.Fatalf("replay across the restart: %v", err)
		}
		if res.Requests != 2 || evB == 0 {
			t.Fatalf("%d requests, daemon B evicted %d", res.Requests, evB)
		}
		if got := res.Evictions["host"]; got != evB {
			t.Errorf("host evictions during the run = %d; daemon B (started during the run) evicted %d (daemon A had %d)", got, evB, evA)
		}
		return
	}
}

// replayAcrossSamePIDRestart replays two requests; between them daemon A
// (which evicted evA blocks before the run) restarts in-process as daemon
// B, which evicts evB blocks, all during the run.
func replayAcrossSamePIDRestart(t *testing.T) (res replayResult, evA, evB uint64, err error) {
	t.Helper()
	// Request 2 (1,500 blocks of 16 KiB, 23 MiB) overflows daemon B's host
	// tier.
	ids := make([]int64, 1500)
	for i := range ids {
		ids[i] = int64(i + 2)
	}
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 512, HashIDs: []int64{1}},
		{Timestamp: 2000, InputLength: len(ids) * trace.BlockTokens, HashIDs: ids},
	}
	path := writeTrace(t, reqs)
	out, evA, evB, err := acrossSamePIDRestart(t, 7, []string{"replay", "--block-size", "16KiB", "--fresh", "--speed", "1", path},
		"commit of request 1", func(a, now *client.Stats) bool { return now.Ops["commit"] > a.Ops["commit"] })
	if err != nil {
		return res, evA, 0, err
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("replay --json: %v\n%s", err, out)
	}
	return res, evA, evB, nil
}

// acrossSamePIDRestart runs kvtierctl args (the subcommand first; --json
// and --socket are added) against daemon A, which evicted evA blocks of
// namespace ns before. Once started(A's stats before, now) says the command
// is under way, A stops and restarts in-process as daemon B on the same
// socket (same pid). It returns the command's output and B's evictions.
func acrossSamePIDRestart(t *testing.T, ns uint32, args []string, what string, started func(a, now *client.Stats) bool) (out string, evA, evB uint64, err error) {
	t.Helper()
	dir := t.TempDir()
	sock, stopA := restartableDaemon(t, dir, 16)
	// 400 blocks of 64 KiB into 16 MiB: daemon A evicts 144 of them.
	putBlocks(t, sock, ns, 400)
	c, err := client.Dial(context.Background(), client.Options{Socket: sock, Name: "kvtierctl-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitStats := func(what string, ok func(*client.Stats) bool) *client.Stats {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if st, err := c.Stats(context.Background()); err == nil && ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 10s", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	// A restart is told by the daemon's start time (now - uptime): let A
	// run long enough that B's differs clearly.
	stA := waitStats("uptime of 1.2s", func(st *client.Stats) bool { return st.UptimeSeconds >= 1.2 })
	if evA = hostTier(stA).Evictions; evA == 0 {
		t.Fatal("daemon A evicted nothing")
	}
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	full := append([]string{args[0], "--json", "--socket", sock}, args[1:]...)
	go func() {
		out, _, err := runCtx(context.Background(), full...)
		done <- result{out, err}
	}()
	waitStats(what, func(st *client.Stats) bool { return started(stA, st) })
	c.Close()
	stopA()
	sock2, _ := restartableDaemon(t, dir, 16) // the daemon restarts on the same socket, in the same process
	r := <-done
	if r.err != nil {
		return "", evA, 0, r.err
	}
	st, _, err := runCtx(context.Background(), "status", "--json", "--socket", sock2)
	if err != nil {
		t.Fatal(err)
	}
	var stB client.Stats
	if err := json.Unmarshal([]byte(st), &stB); err != nil {
		t.Fatal(err)
	}
	return r.out, evA, hostTier(&stB).Evictions, nil
}
