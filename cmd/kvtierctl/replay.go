package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/policy"
	"github.com/kvtier/kvtier/tiers/trace"
)

// replayModelID names the namespace replay writes into; its block size is
// --block-size, so runs with different sizes use different namespaces.
const replayModelID = "kvtierctl-replay"

// defaultReplaySeed is the hash seed when neither --seed nor --fresh is
// given: fixed, so a re-run against the same daemon finds the blocks its
// earlier runs left behind. The value is arbitrary.
const defaultReplaySeed = 0x6b767472_65706c79

// replayBatch bounds the blocks of one GetBatch or PutBatch call, and with it
// the buffer memory of a session (replayBatch × block size).
const replayBatch = 64

type replayOpts struct {
	blockSize  byteSize
	seed       uint64
	fresh      bool
	speed      float64
	limit      int
	sessions   int
	simulate   bool
	capacities []int
	policies   []string
}

func newReplayCmd(g *globals) *cobra.Command {
	o := replayOpts{blockSize: 256 << 10, seed: defaultReplaySeed}
	cmd := &cobra.Command{
		Use:   "replay FILE.jsonl",
		Short: "Replay a Mooncake KV-cache trace against the daemon, or simulate policies on it",
		Long: `replay reads a trace in the Mooncake format (JSON Lines: timestamp ms,
input_length, output_length, hash_ids = the prompt's prefix-chained blocks of
512 tokens) and drives a running kvtierd with it, like an inference engine
would. Per request, in trace order:

  1. Lookup the whole chain: h leading blocks are cached (and in which tier);
  2. Get the h hits, verifying every byte (a block's payload is derived from
     its hash, so a wrong block cannot pass);
  3. Put the misses: every block after the first miss (already-cached ones
     are skipped by the daemon).

Block size: a trace block is 512 tokens, which in a real model is far larger
than the default --block-size of 256KiB (Llama-3-8B in fp16 holds 128 KiB of
K+V per token, so 64 MiB per 512-token block). The daemon's hit ratios depend
only on how many blocks fit in its tiers, so a small block size replays a
large trace on a small machine; choose it so that the trace's distinct blocks
overflow the host tier if the NVMe tier is to be exercised.

Trace block id i maps to the hash {Hi: seed, Lo: i} in namespace
"` + replayModelID + `" (one per block size). The seed is fixed unless --seed or
--fresh is given, so a second run against the same daemon finds what the
first one left: replay does not delete its blocks (kvtierctl evict
--namespace ID does). Requests are spread round-robin over --sessions
sessions, each replaying its share in trace order on its own goroutine.
--speed 1 honours the trace's timestamps (2 = twice as fast); the default 0
replays as fast as the daemon answers. --timeout bounds each request
(lookup, gets and puts together).

Reported: block hit ratio per tier (from Lookup), prefix hit ratio (prompt
tokens served from cache / all prompt tokens, from the blocks actually got
and verified, the last block of a prompt counting its partial tokens), bytes
moved between tiers during the run (daemon-wide, so other clients' traffic is
included), op latency, byte verification failures (must be 0) and Get misses
of blocks that Lookup had just reported (evicted in between).

--simulate runs the policy simulator of kvtier instead (no daemon): for each
--capacity-blocks and each --policy it prints the prefix hit ratio (leading
cached blocks / all blocks), the offline optimum (Belady's MIN) as the
ceiling, and the fraction of the LRU→Belady gap each policy closes. LRU, the
gap's baseline, is always simulated.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			if o.fresh && f.Changed("seed") {
				return errors.New("replay: give --seed or --fresh, not both")
			}
			if o.simulate {
				for _, name := range []string{"block-size", "seed", "fresh", "speed", "sessions"} {
					if f.Changed(name) {
						return fmt.Errorf("replay: --%s has no effect with --simulate", name)
					}
				}
			} else {
				for _, name := range []string{"capacity-blocks", "policy"} {
					if f.Changed(name) {
						return fmt.Errorf("replay: --%s needs --simulate", name)
					}
				}
			}
			return runReplay(cmd, g, o, args[0])
		},
	}
	f := cmd.Flags()
	f.Var(&o.blockSize, "block-size", "bytes per trace block (a 512-token block of a real model is far larger; see above)")
	f.Uint64Var(&o.seed, "seed", defaultReplaySeed, "hash seed (decimal or 0x hex): block id i is hash {seed, i}; keep it to find earlier runs' blocks")
	f.BoolVar(&o.fresh, "fresh", false, "use a random seed: start from an empty cache as far as this run is concerned")
	f.Float64Var(&o.speed, "speed", 0, "honour the trace's timestamps at this speed-up (1 = real time); 0 = as fast as possible")
	f.IntVar(&o.limit, "limit", 0, "replay only the first N requests (0 = all)")
	f.IntVar(&o.sessions, "sessions", 1, "sessions, one goroutine each; requests are dealt round-robin and keep their order per session")
	f.BoolVar(&o.simulate, "simulate", false, "simulate policies offline instead of driving a daemon")
	f.IntSliceVar(&o.capacities, "capacity-blocks", []int{2000, 10000, 20000}, "simulated cache sizes in blocks, a comma-separated list (0 = unlimited)")
	f.StringSliceVar(&o.policies, "policy", []string{policy.Default, "lru"},
		"simulated policies, a comma-separated list or \"all\" (have "+strings.Join(policy.Names(), ", ")+")")
	return cmd
}

func runReplay(cmd *cobra.Command, g *globals, o replayOpts, path string) error {
	switch {
	case o.limit < 0:
		return errors.New("replay: --limit must be ≥ 0")
	case o.sessions < 1:
		return errors.New("replay: --sessions must be ≥ 1")
	case !(o.speed >= 0) || math.IsInf(o.speed, 1):
		return errors.New("replay: --speed must be a finite number ≥ 0")
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	reqs, err := readTrace(ctx, path, o.limit)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if len(reqs) == 0 {
		return fmt.Errorf("replay: %s holds no requests", path)
	}
	if o.simulate {
		res, err := simulateTrace(ctx, reqs, o.capacities, o.policies)
		if err != nil {
			return err
		}
		res.Trace = path
		if g.json {
			return writeJSON(stdout(cmd), res)
		}
		printSimulation(stdout(cmd), res)
		return nil
	}
	return runLiveReplay(cmd, g, o, path, reqs)
}

// readTrace reads the first limit requests of the trace at path (all of
// them if limit is 0): the lines after them are neither read nor validated.
// It gives up when ctx is done.
func readTrace(ctx context.Context, path string, limit int) ([]trace.Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := trace.NewReader(f)
	var reqs []trace.Request
	for limit == 0 || len(reqs) < limit {
		if len(reqs)%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		req, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		reqs = append(reqs, req)
	}
	return reqs, nil
}

// ---- simulate ------------------------------------------------------------

// simResult is what --simulate reports; --json prints it as is.
type simResult struct {
	Trace          string        `json:"trace"`
	Requests       int           `json:"requests"`
	BlockRefs      int           `json:"block_refs"`
	DistinctBlocks int           `json:"distinct_blocks"`
	UnlimitedHit   float64       `json:"unlimited_hit_ratio"`
	Seconds        float64       `json:"seconds"`
	Capacities     []simCapacity `json:"capacities"`
}

// simCapacity is one cache size: every policy's figure and the ceiling.
type simCapacity struct {
	CapacityBlocks int         `json:"capacity_blocks"` // 0 = unlimited
	LRU            float64     `json:"lru_hit_ratio"`
	Belady         float64     `json:"belady_hit_ratio"`
	Policies       []simPolicy `json:"policies"`
}

// simPolicy is one policy at one size. GapClosed is (hit − LRU) / (Belady −
// LRU); absent when Belady does not beat LRU (no gap to close).
type simPolicy struct {
	Policy    string   `json:"policy"`
	Default   bool     `json:"default,omitempty"` // the daemon's default policy
	HitRatio  float64  `json:"hit_ratio"`
	GapClosed *float64 `json:"gap_closed,omitempty"`
	Inserts   int      `json:"inserts"`
	Rejects   int      `json:"rejects"`
	Evictions int      `json:"evictions"`
}

// simPolicies resolves --policy: "all" expands, LRU (the gap's baseline)
// comes first whether named or not, duplicates go, unknown names fail.
func simPolicies(names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		switch {
		case n == "":
			continue
		case n == "all":
			out = append(out, policy.Names()...)
			continue
		case n == "belady":
			continue // always reported as the ceiling
		case !slices.Contains(policy.Names(), n):
			return nil, fmt.Errorf("replay: unknown --policy %q (have %s, all)", n, strings.Join(policy.Names(), ", "))
		}
		out = append(out, n)
	}
	// LRU first: simulateTrace reads the baseline from column 0.
	out = append([]string{"lru"}, out...)
	seen := map[string]bool{}
	return slices.DeleteFunc(out, func(n string) bool {
		dup := seen[n]
		seen[n] = true
		return dup
	}), nil
}

// simulateTrace runs every policy and Belady at every capacity, in parallel
// (each simulation owns its policy; the compiled workload is only read).
// It stops early with ctx's error when ctx is done (Ctrl-C).
func simulateTrace(ctx context.Context, reqs []trace.Request, capacities []int, names []string) (*simResult, error) {
	if len(capacities) == 0 {
		return nil, errors.New("replay: --capacity-blocks is empty")
	}
	for _, c := range capacities {
		if c < 0 {
			return nil, fmt.Errorf("replay: --capacity-blocks %d is negative", c)
		}
	}
	pols, err := simPolicies(names)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	w := policy.Compile(reqs)
	ts := trace.Summarize(reqs)
	res := &simResult{Requests: len(reqs), BlockRefs: w.Refs(), DistinctBlocks: w.Blocks(), UnlimitedHit: ts.InfiniteHit}

	// One job per (capacity, policy) plus one Belady per capacity; column
	// len(pols) holds Belady.
	out := make([][]policy.Result, len(capacities))
	type job struct{ ci, pi int }
	jobs := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range min(runtime.GOMAXPROCS(0), len(capacities)*(len(pols)+1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				c := capacities[j.ci]
				var p policy.Policy
				if j.pi == len(pols) {
					p = policy.NewBelady(w, c)
				} else {
					// The policy's size hint is the cache's capacity, as
					// in the daemon (the trace's block count would leak
					// knowledge of the future into ghost-list sizes). An
					// unlimited cache (0) never evicts: any hint works;
					// neither does one that holds every block of the
					// trace (the policies allocate per block of hint).
					hint := c
					if hint == 0 || hint > w.Blocks() {
						hint = max(w.Blocks(), 1)
					}
					var err error
					if p, err = policy.New(pols[j.pi], hint); err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						continue
					}
				}
				r, err := w.SimulateContext(ctx, c, p)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				out[j.ci][j.pi] = r
			}
		}()
	}
	for ci := range capacities {
		out[ci] = make([]policy.Result, len(pols)+1)
		for pi := range len(pols) + 1 {
			jobs <- job{ci, pi}
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}

	for ci, c := range capacities {
		rs := out[ci]
		lru, belady := rs[0].HitRatio(), rs[len(pols)].HitRatio()
		sc := simCapacity{CapacityBlocks: c, LRU: lru, Belady: belady}
		for pi, name := range pols {
			r := rs[pi]
			sp := simPolicy{Policy: name, Default: name == policy.Default, HitRatio: r.HitRatio(), Inserts: r.Inserts, Rejects: r.Rejects, Evictions: r.Evictions}
			if gap := belady - lru; gap > 1e-12 {
				f := (sp.HitRatio - lru) / gap
				sp.GapClosed = &f
			}
			sc.Policies = append(sc.Policies, sp)
		}
		res.Capacities = append(res.Capacities, sc)
	}
	res.Seconds = time.Since(t0).Seconds()
	return res, nil
}

func capacityString(c int) string {
	if c == 0 {
		return "unlimited"
	}
	return fmt.Sprint(c)
}

func printSimulation(w io.Writer, res *simResult) {
	fmt.Fprintf(w, "trace %s: %d requests, %d block references, %d distinct blocks\n",
		res.Trace, res.Requests, res.BlockRefs, res.DistinctBlocks)
	fmt.Fprintf(w, "prefix hit ratio = leading cached blocks / all blocks; unlimited cache: %.4f\n\n", res.UnlimitedHit)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CAPACITY\tPOLICY\tHIT RATIO\tGAP CLOSED\tINSERTS\tREJECTS\tEVICTIONS\t")
	for _, c := range res.Capacities {
		for i, p := range c.Policies {
			capS := ""
			if i == 0 {
				capS = capacityString(c.CapacityBlocks)
			}
			gap := "-"
			if p.GapClosed != nil {
				gap = fmt.Sprintf("%.1f%%", 100**p.GapClosed)
			}
			name := p.Policy
			if p.Default {
				name += " (default)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%.4f\t%s\t%d\t%d\t%d\t\n", capS, name, p.HitRatio, gap, p.Inserts, p.Rejects, p.Evictions)
		}
		fmt.Fprintf(tw, "\tbelady (MIN)\t%.4f\t%s\t\t\t\t\n", c.Belady, "100%")
	}
	tw.Flush()
	fmt.Fprintf(w, "\ngap closed = (policy − LRU) / (Belady − LRU); simulated in %.2fs\n", res.Seconds)
	// The daemon's policy picks what its host tier demotes to NVMe; a host
	// tier with no NVMe tier below drops by its own LRU (tiers.ChainConfig).
	fmt.Fprintln(w, "the daemon applies its policy (host.policy) to the host tier's demotions to NVMe; without an NVMe tier its host tier evicts LRU")
}

// ---- live ----------------------------------------------------------------

// hostHoldsBlocks is how many blocks of the given size the host tier h
// keeps, as plan counts them (slabKeepsBlocks): whole blocks per slab, and
// with an NVMe tier below (HighWatermark set) no more than its mover
// leaves under its high watermark, which counts slab space.
func hostHoldsBlocks(h *shm.TierStats, block uint64) int64 {
	return int64(slabKeepsBlocks(uint64(max(h.CapacityBytes, 0)), uint64(max(h.SlabBytes, 0)), block, h.HighWatermark, true))
}

// replayHash is the daemon hash of trace block id under seed.
func replayHash(seed uint64, id int64) client.Hash { return client.Hash{Hi: seed, Lo: uint64(id)} }

// replayPayload fills b with bytes derived from h alone (splitmix64 seeded by
// the hash), so a block read back can be verified without keeping a copy, and
// blocks of different hashes never match.
func replayPayload(b []byte, h client.Hash) {
	x := h.Hi*0x9e3779b97f4a7c15 ^ h.Lo
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^(z>>31))
	}
	for ; i < len(b); i++ {
		b[i] = byte(x >> (8 * (i % 8)))
	}
}

// replayNamespace is the namespace of one block size. Only BlockBytes
// matters to the daemon; a block is the trace's 512 tokens.
func replayNamespace(blockBytes uint64) client.Namespace {
	return client.Namespace{
		ModelID: replayModelID, Layers: 1, KVHeads: 1, HeadDim: 1, DType: "fp16",
		TokensPerBlock: trace.BlockTokens, TPSize: 1, BlockBytes: blockBytes,
	}
}

// replay op kinds, indexing the latency samples.
// A request's get also counts as get-nvme when its lookup found blocks in
// NVMe (served by promotion) and as get-host otherwise: their tails differ
// by the disk, and an operator tuning swap-in watches the first.
const (
	rLookup = iota
	rGet
	rGetHost
	rGetNVMe
	rPut
	rKinds
)

var replayKindNames = [rKinds]string{"lookup", "get", "get-host", "get-nvme", "put"}

// tierHit is the share of referenced blocks that Lookup found in one tier.
type tierHit struct {
	Tier   string  `json:"tier"`
	Blocks uint64  `json:"blocks"`
	Ratio  float64 `json:"ratio"`
}

// moveDelta is the traffic between two tiers during the run.
type moveDelta struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Blocks uint64 `json:"blocks"`
	Bytes  uint64 `json:"bytes"`
	Errors uint64 `json:"errors"`
}

// replayResult is everything a live replay reports; --json prints it as is.
type replayResult struct {
	Trace          string  `json:"trace"`
	Seed           string  `json:"seed"` // hex: exact in any JSON reader; --seed takes it back
	BlockBytes     uint64  `json:"block_bytes"`
	Sessions       int     `json:"sessions"`
	Speed          float64 `json:"speed"`
	Seconds        float64 `json:"seconds"`
	Interrupted    bool    `json:"interrupted,omitempty"`
	HostCapBlocks  int64   `json:"host_capacity_blocks"` // the most the host tier keeps at rest
	Requests       int     `json:"requests"`
	BlockRefs      uint64  `json:"block_refs"`
	DistinctBlocks int     `json:"distinct_blocks"`
	PromptTokens   uint64  `json:"prompt_tokens"`

	// From Lookup: leading cached blocks, split by tier.
	BlockHits     []tierHit `json:"block_hits"`
	BlockHitRatio float64   `json:"block_hit_ratio"`
	// From the blocks got and verified: the prefix actually served.
	TokensServed   uint64  `json:"tokens_served"`
	PrefixHitRatio float64 `json:"prefix_hit_ratio"`

	GetBlocks      uint64 `json:"get_blocks"`
	GetMisses      uint64 `json:"get_misses_after_lookup_hit"`
	VerifyFailures uint64 `json:"verify_failures"`
	PutBlocks      uint64 `json:"put_blocks"`
	PutStored      uint64 `json:"put_stored"`
	PutSkipped     uint64 `json:"put_skipped"`    // already cached, or refused for a full tier
	PutFullCalls   uint64 `json:"put_full_calls"` // PutBatch calls that met a full tier
	BytesIn        uint64 `json:"bytes_put"`
	BytesOut       uint64 `json:"bytes_got"`

	Moves     []moveDelta        `json:"moves"`
	Evictions map[string]uint64  `json:"evictions"` // per tier, during the run
	Latency   map[string]latency `json:"latency"`
}

// replayWorker is one session's goroutine state; its counters are its own
// until the run ends.
type replayWorker struct {
	s    *client.Session
	reqs []int // indices into the trace, in order
	bufs [][]byte
	want []byte
	hs   []client.Hash

	samples [rKinds][]int64
	done    int // leading requests of reqs completed
	replayCounts
}

// replayCounts are a worker's counters. They cover its completed requests
// only: a request that fails or is interrupted midway is rolled back.
type replayCounts struct {
	tierHits [256]uint64
	refs     uint64
	tokens   uint64
	served   uint64

	getBlocks, getMisses, verifyFail uint64
	putBlocks, putStored, putFull    uint64
	bytesIn, bytesOut                uint64
}

func runLiveReplay(cmd *cobra.Command, g *globals, o replayOpts, path string, reqs []trace.Request) error {
	seed := o.seed
	if o.fresh {
		var b [8]byte
		rand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:])
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	setup, cancel := g.ctx(ctx)
	defer cancel()
	c, err := g.dial(setup)
	if err != nil {
		return err
	}
	defer c.Close()
	before, err := c.Stats(setup)
	if err != nil {
		return err
	}
	beforeAt := time.Now()
	block := uint64(o.blockSize)
	ns := replayNamespace(block)
	ws := make([]*replayWorker, o.sessions)
	for i := range ws {
		s, err := c.Open(setup, ns)
		if err != nil {
			return fmt.Errorf("replay: open session %d: %w", i, err)
		}
		w := &replayWorker{s: s, want: make([]byte, block), bufs: make([][]byte, replayBatch)}
		for j := range w.bufs {
			w.bufs[j] = make([]byte, block)
		}
		ws[i] = w
	}
	for i := range reqs {
		w := ws[i%len(ws)]
		w.reqs = append(w.reqs, i)
	}

	var done atomic.Int64
	stopBar := startReplayProgress(cmd, g, len(reqs), &done)
	t0 := time.Now()
	// A session that fails stops the others: the replay has failed, and
	// they might run (or wait on the trace's clock) for hours.
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = w.run(runCtx, g, o, seed, reqs, t0, &done); errs[i] != nil {
				stopRun(errs[i])
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	stopBar()
	interrupted := ctx.Err() != nil
	if !interrupted {
		if err := context.Cause(runCtx); err != nil {
			return fmt.Errorf("replay: %w", err) // the first failure, not the stops it caused
		}
	}

	res := &replayResult{
		Trace: path, Seed: fmt.Sprintf("%#x", seed), BlockBytes: block, Sessions: o.sessions, Speed: o.speed,
		Seconds: elapsed.Seconds(), Interrupted: interrupted, Requests: int(done.Load()),
	}
	if h := hostTier(before); h != nil {
		res.HostCapBlocks = hostHoldsBlocks(h, block)
	}
	// The requests completed: each session's leading share (sessions run
	// their shares independently, so after an interrupt these are not the
	// trace's first res.Requests requests).
	distinct := map[int64]struct{}{}
	for _, w := range ws {
		for _, ri := range w.reqs[:w.done] {
			for _, id := range reqs[ri].HashIDs {
				distinct[id] = struct{}{}
			}
		}
	}
	res.DistinctBlocks = len(distinct)
	// A fresh deadline: setup's may have expired during the run.
	sctx, scancel := g.ctx(context.Background())
	defer scancel()
	after, err := c.Stats(sctx)
	if err != nil {
		return err
	}
	res.summarize(ws, before, after, time.Since(beforeAt))
	if g.json {
		err = writeJSON(stdout(cmd), res)
	} else {
		printReplay(stdout(cmd), res)
	}
	if interrupted {
		return ctx.Err()
	}
	return err
}

// replayRequestHook, when set (tests only), is called after each request
// (ri: its index in the trace) and replaces its error.
var replayRequestHook func(ri int, err error) error

// run replays the worker's share of the trace.
func (w *replayWorker) run(ctx context.Context, g *globals, o replayOpts, seed uint64, reqs []trace.Request, t0 time.Time, done *atomic.Int64) error {
	ts0 := reqs[0].Timestamp
	for _, ri := range w.reqs {
		r := &reqs[ri]
		if o.speed > 0 {
			// A delay beyond time.Duration's range (slow motion of a long
			// trace) saturates rather than wrapping negative.
			delay := time.Duration(math.MaxInt64)
			if f := float64(r.Timestamp-ts0) * float64(time.Millisecond) / o.speed; f < float64(math.MaxInt64) {
				delay = time.Duration(f)
			}
			if d := time.Until(t0.Add(delay)); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-t.C:
				}
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rctx, cancel := g.ctx(ctx)
		counts, nsamples := w.replayCounts, [rKinds]int{}
		for k := range nsamples {
			nsamples[k] = len(w.samples[k])
		}
		err := w.request(rctx, seed, r)
		cancel()
		if replayRequestHook != nil {
			err = replayRequestHook(ri, err)
		}
		if err != nil {
			// The figures cover completed requests: drop this one's.
			w.replayCounts = counts
			for k, n := range nsamples {
				w.samples[k] = w.samples[k][:n]
			}
			return fmt.Errorf("request %d (line %d): %w", ri, r.Line, err)
		}
		w.done++
		done.Add(1)
	}
	return nil
}

// request replays one request: Lookup, Get the hits, Put the rest.
func (w *replayWorker) request(ctx context.Context, seed uint64, r *trace.Request) error {
	n := len(r.HashIDs)
	w.hs = w.hs[:0]
	for _, id := range r.HashIDs {
		w.hs = append(w.hs, replayHash(seed, id))
	}
	hs := w.hs
	w.refs += uint64(n)
	w.tokens += uint64(r.InputLength)
	if n == 0 {
		return nil
	}

	t := time.Now()
	lr, err := w.s.Lookup(ctx, hs)
	if err != nil {
		return err
	}
	w.samples[rLookup] = append(w.samples[rLookup], int64(time.Since(t)))
	for _, tier := range lr.Tiers {
		w.tierHits[tier]++
	}

	// served: the leading blocks got and verified; a miss or a bad block
	// ends the prefix an engine could use.
	served := lr.Hits
	if lr.Hits > 0 {
		var el time.Duration
		for lo := 0; lo < lr.Hits; lo += replayBatch {
			hi := min(lo+replayBatch, lr.Hits)
			bufs := w.bufs[:hi-lo]
			t := time.Now()
			found, err := w.s.GetBatch(ctx, hs[lo:hi], bufs)
			el += time.Since(t)
			if err != nil {
				return err
			}
			for j, ok := range found {
				w.getBlocks++
				if !ok {
					w.getMisses++
					served = min(served, lo+j)
					continue
				}
				w.bytesOut += uint64(len(bufs[j]))
				replayPayload(w.want, hs[lo+j])
				if !bytes.Equal(bufs[j], w.want) {
					w.verifyFail++
					served = min(served, lo+j)
				}
			}
		}
		w.samples[rGet] = append(w.samples[rGet], int64(el))
		kind := rGetHost
		if slices.Contains(lr.Tiers, client.TierNVMe) {
			kind = rGetNVMe
		}
		w.samples[kind] = append(w.samples[kind], int64(el))
	}
	w.served += uint64(min(served*trace.BlockTokens, r.InputLength))

	if served < n {
		var el time.Duration
		for lo := served; lo < n; lo += replayBatch {
			hi := min(lo+replayBatch, n)
			bufs := w.bufs[:hi-lo]
			for j := range bufs {
				replayPayload(bufs[j], hs[lo+j])
			}
			t := time.Now()
			stored, err := w.s.PutBatch(ctx, hs[lo:hi], bufs)
			el += time.Since(t)
			switch {
			case errors.Is(err, client.ErrFull):
				w.putFull++
			case err != nil:
				return err
			}
			w.putBlocks += uint64(hi - lo)
			w.putStored += uint64(stored)
			w.bytesIn += uint64(stored) * uint64(len(w.want))
		}
		w.samples[rPut] = append(w.samples[rPut], int64(el))
	}
	return nil
}

// summarize totals the workers' counters; before and after are the daemon's
// status at the start and, elapsed later, at the end of the run.
func (res *replayResult) summarize(ws []*replayWorker, before, after *client.Stats, elapsed time.Duration) {
	var tiers [256]uint64
	var all [rKinds][]int64
	var hits uint64
	for _, w := range ws {
		res.BlockRefs += w.refs
		res.PromptTokens += w.tokens
		res.TokensServed += w.served
		res.GetBlocks += w.getBlocks
		res.GetMisses += w.getMisses
		res.VerifyFailures += w.verifyFail
		res.PutBlocks += w.putBlocks
		res.PutStored += w.putStored
		res.PutFullCalls += w.putFull
		res.BytesIn += w.bytesIn
		res.BytesOut += w.bytesOut
		for t, c := range w.tierHits {
			tiers[t] += c
			hits += c
		}
		for k := range all {
			all[k] = append(all[k], w.samples[k]...)
		}
	}
	res.PutSkipped = res.PutBlocks - res.PutStored
	ratio := func(a, b uint64) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	// Host and NVMe always show; other tiers when they served something.
	for t, c := range tiers {
		tier := shm.Tier(t)
		if c > 0 || tier == client.TierHost || tier == client.TierNVMe {
			res.BlockHits = append(res.BlockHits, tierHit{Tier: tier.String(), Blocks: c, Ratio: ratio(c, res.BlockRefs)})
		}
	}
	res.BlockHitRatio = ratio(hits, res.BlockRefs)
	res.PrefixHitRatio = ratio(res.TokensServed, res.PromptTokens)

	// A daemon restarted during the run (the sessions reconnect) counts
	// from zero: its counters are all from the run; the old one's are lost.
	if !sameDaemon(before, after, elapsed) {
		before = &client.Stats{}
	}
	prev := map[[2]string]shm.MoveStats{}
	for _, m := range before.Moves {
		prev[[2]string{m.From, m.To}] = m
	}
	for _, m := range after.Moves {
		p := prev[[2]string{m.From, m.To}]
		res.Moves = append(res.Moves, moveDelta{From: m.From, To: m.To,
			Blocks: delta(m.Blocks, p.Blocks), Bytes: delta(m.Bytes, p.Bytes), Errors: delta(m.Errors, p.Errors)})
	}
	ev := map[string]uint64{}
	for _, t := range before.Tiers {
		ev[t.Name] = t.Evictions
	}
	res.Evictions = map[string]uint64{}
	for _, t := range after.Tiers {
		res.Evictions[t.Name] = delta(t.Evictions, ev[t.Name])
	}
	res.Latency = map[string]latency{}
	for k := range all {
		if len(all[k]) > 0 {
			res.Latency[replayKindNames[k]] = summarize(all[k])
		}
	}
}

func printReplay(w io.Writer, res *replayResult) {
	speed := "as fast as possible"
	if res.Speed > 0 {
		speed = fmt.Sprintf("%gx trace time", res.Speed)
	}
	fmt.Fprintf(w, "replay %s: %d requests in %.2fs (%s), %d session(s)\n", res.Trace, res.Requests, res.Seconds, speed, res.Sessions)
	if res.Interrupted {
		fmt.Fprintln(w, "INTERRUPTED: figures cover the requests completed so far")
	}
	fmt.Fprintf(w, "block %s, seed %s; %d distinct blocks (%s); host tier holds %d blocks\n",
		humanize.IBytes(res.BlockBytes), res.Seed, res.DistinctBlocks,
		humanize.IBytes(uint64(res.DistinctBlocks)*res.BlockBytes), res.HostCapBlocks)
	fmt.Fprintf(w, "\nblocks referenced  %d\n", res.BlockRefs)
	for _, h := range res.BlockHits {
		fmt.Fprintf(w, "  hit in %-10s %6.2f%%  (%d blocks)\n", h.Tier, 100*h.Ratio, h.Blocks)
	}
	fmt.Fprintf(w, "  hit, all tiers   %6.2f%%\n", 100*res.BlockHitRatio)
	fmt.Fprintf(w, "prefix hit ratio   %6.2f%%  (%d of %d prompt tokens served from cache)\n",
		100*res.PrefixHitRatio, res.TokensServed, res.PromptTokens)

	fmt.Fprintf(w, "\ngets  %d blocks, %d missed after a lookup hit, %d failed verification\n", res.GetBlocks, res.GetMisses, res.VerifyFailures)
	fmt.Fprintf(w, "puts  %d blocks, %d stored, %d skipped (cached or tier full), %d calls met a full tier\n",
		res.PutBlocks, res.PutStored, res.PutSkipped, res.PutFullCalls)
	fmt.Fprintf(w, "bytes %s put, %s got\n", humanize.IBytes(res.BytesIn), humanize.IBytes(res.BytesOut))

	fmt.Fprintln(w, "\nmoved between tiers during the run (daemon-wide):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "FROM\tTO\tBLOCKS\tBYTES\tERRORS\t")
	for _, m := range res.Moves {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t\n", m.From, m.To, m.Blocks, humanize.IBytes(m.Bytes), m.Errors)
	}
	tw.Flush()
	names := make([]string, 0, len(res.Evictions))
	for n := range res.Evictions {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %d", n, res.Evictions[n])
	}
	fmt.Fprintf(w, "evictions: %s\n\n", strings.Join(parts, ", "))

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "OP\tCOUNT\tMEAN µs\tP50 µs\tP99 µs\tP99.9 µs\tMAX µs\t")
	for _, k := range replayKindNames {
		l, ok := res.Latency[k]
		if !ok {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", k, l.Count, l.MeanUS, l.P50US, l.P99US, l.P999US, l.MaxUS)
	}
	tw.Flush()
	fmt.Fprintln(w, "(per request: one lookup of the chain; get and put of all its hit / missed blocks;")
	fmt.Fprintln(w, " get-nvme: those whose lookup found blocks in NVMe, served by promotion; get-host: the others)")
}

// startReplayProgress draws a request-count bar on stderr when it is a
// terminal and output is for humans; it returns a func that clears it.
func startReplayProgress(cmd *cobra.Command, g *globals, total int, done *atomic.Int64) func() {
	return startBar(cmd, g, int64(total), "replay", true, func(bar *progressbar.ProgressBar) {
		bar.Set64(done.Load())
	})
}
