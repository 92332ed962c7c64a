package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// Bench modes.
const (
	modePutGet      = "putget"
	modeMix         = "mix"
	modeLookup      = "lookup"
	modeLookupBatch = "lookup-batch"
	modeNop         = "nop"
)

// opKind indexes the per-kind latency logs.
type opKind int

const (
	opPut opKind = iota
	opGet
	opLookup
	opLookupBatch
	opNop
	opDelete // putget's deletes that keep the working set bounded
	numKinds
)

var kindNames = [numKinds]string{"put", "get", "lookup", "lookup-batch", "nop", "delete"}

// tokenBytes is one token's K+V in the bench namespace's layout
// (2 × 32 layers × 8 kv heads × 128 dims × fp16): a Llama-3-8B-like model,
// so a 2 MiB block is 16 tokens.
const tokenBytes = 2 * 32 * 8 * 128 * 2

// benchNamespace returns a namespace of exactly blockBytes per block. Only
// BlockBytes matters to the daemon; the layout is chosen to be plausible.
func benchNamespace(blockBytes uint64) client.Namespace {
	ns := client.Namespace{ModelID: "kvtierctl-bench", DType: "fp16", TPSize: 1, BlockBytes: blockBytes}
	if blockBytes%tokenBytes == 0 {
		ns.Layers, ns.KVHeads, ns.HeadDim, ns.TokensPerBlock = 32, 8, 128, uint32(blockBytes/tokenBytes)
	} else {
		ns.Layers, ns.KVHeads, ns.HeadDim, ns.TokensPerBlock = 1, 1, 1, uint32(max(blockBytes/4, 1))
	}
	return ns
}

// lookupNamespace holds the tiny blocks that lookup-batch pre-populates:
// the index probe does not depend on block size, so tiny blocks let a long
// chain fit in any host tier.
var lookupNamespace = client.Namespace{
	ModelID: "kvtierctl-bench-lookup", Layers: 1, KVHeads: 1, HeadDim: 16, DType: "fp16",
	TokensPerBlock: 1, TPSize: 1, BlockBytes: 64,
}

// slotAlign is the host tier's slot alignment (tiers.DefaultAlign); Stats
// does not report it, and the CLI must not import daemon internals.
const slotAlign = 4096

type benchOpts struct {
	mode        string
	blockSize   byteSize
	sessions    int
	duration    time.Duration
	warmup      time.Duration
	mix         string
	lookupChain int
	zeroCopy    bool
	keys        int
}

func newBenchCmd(g *globals) *cobra.Command {
	o := benchOpts{blockSize: 2 << 20}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the daemon's data path against this machine's memcpy",
		Long: `bench drives kvtierd through the client library, like an engine would.

Modes:
  putget        PUT a fresh block, then GET it back (default). GB/s counts
                the bytes copied in and out (2 blocks per pair) and is
                compared with a single-core memcpy baseline measured in the
                same process right before and after the run.
  mix           weighted put/get/lookup (--mix) of random keys of a key
                space of --keys blocks; gets of absent keys are misses, puts
                of present keys are duplicates (no copy). Lookups probe one
                key.
  lookup        single-key Lookup round trip of a cached key.
  lookup-batch  Lookup of a --lookup-chain chain of cached keys; keys/s.
  nop           bare ring round trip.

Every session (--sessions) is its own client session on its own goroutine.
The bench's blocks use random hashes and are deleted at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("mix") && !cmd.Flags().Changed("mode") {
				o.mode = modeMix
			}
			return runBench(cmd, g, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.mode, "mode", modePutGet, "putget, mix, lookup, lookup-batch or nop")
	f.Var(&o.blockSize, "block-size", "block size of the bench namespace")
	f.IntVar(&o.sessions, "sessions", 1, "concurrent sessions, one goroutine each")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "measured run time")
	f.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured run time before the measurement")
	f.StringVar(&o.mix, "mix", "put=1,get=1,lookup=1", "op weights of --mode mix (implies it)")
	f.IntVar(&o.lookupChain, "lookup-chain", 1000, "keys per batched lookup (lookup-batch)")
	f.BoolVar(&o.zeroCopy, "zero-copy", false, "use Reserve/Commit and Acquire/Release (one copy each) instead of Put/Get")
	f.IntVar(&o.keys, "keys", 0, "working set in blocks (default: what fits in 80% of the host tier's free capacity)")
	return cmd
}

// benchResult is everything bench reports; --json prints it as is.
type benchResult struct {
	Mode            string  `json:"mode"`
	Mix             string  `json:"mix,omitempty"`
	ZeroCopy        bool    `json:"zero_copy"`
	BlockBytes      uint64  `json:"block_bytes"`
	Sessions        int     `json:"sessions"`
	Keys            int     `json:"keys"`
	WorkingSetBytes uint64  `json:"working_set_bytes"`
	LookupChain     int     `json:"lookup_chain,omitempty"`
	Seconds         float64 `json:"seconds"`

	Ops       uint64  `json:"ops"`
	OpsPerSec float64 `json:"ops_per_sec"`
	// PairsPerSec is PUT+GET pairs per second (putget).
	PairsPerSec float64 `json:"pairs_per_sec,omitempty"`
	// KeysPerSec is looked-up keys per second (lookup-batch).
	KeysPerSec float64 `json:"keys_per_sec,omitempty"`
	BytesMoved uint64  `json:"bytes_moved"`
	GBPerSec   float64 `json:"gb_per_sec"`

	Latency map[string]latency `json:"latency"`

	PutStored  uint64 `json:"put_stored,omitempty"`
	PutDup     uint64 `json:"put_duplicate,omitempty"`
	PutFull    uint64 `json:"put_full,omitempty"`
	GetHits    uint64 `json:"get_hits,omitempty"`
	GetMisses  uint64 `json:"get_misses,omitempty"`
	LookupMiss uint64 `json:"lookup_misses,omitempty"`
	Evictions  uint64 `json:"daemon_evictions"`

	Memcpy        *memcpyResult `json:"memcpy,omitempty"`
	RatioToMemcpy float64       `json:"ratio_to_memcpy,omitempty"`
	Deleted       int           `json:"deleted_blocks"`
}

type memcpyResult struct {
	RegionBytes    int64   `json:"region_bytes"`
	BeforeGBPerSec float64 `json:"before_gb_per_sec"`
	AfterGBPerSec  float64 `json:"after_gb_per_sec"`
	GBPerSec       float64 `json:"gb_per_sec"`
}

// worker is one session's goroutine state. Counters and samples are its
// own until the run ends, so the hot loop shares nothing but the stop flag.
type worker struct {
	id      int
	s       *client.Session
	rng     *mrand.Rand
	src     []byte
	dst     []byte
	samples [numKinds][]int64

	ops, bytes                   uint64
	putStored, putDup, putFull   uint64
	getHits, getMisses, lookMiss uint64
	lookKeys                     uint64
	live                         []client.Hash // putget: blocks still cached, to delete at the end
	lastEnd                      time.Time
}

// run state shared by the workers.
type benchRun struct {
	o            benchOpts
	mix          mixWeights
	base         client.Hash // random per run so concurrent or earlier runs never collide
	keys         int
	measureStart time.Time
	end          time.Time
	stop         atomic.Bool
	chain        []client.Hash // lookup, lookup-batch, mix key space
}

func (r *benchRun) hash(worker, i int) client.Hash {
	return client.Hash{Hi: r.base.Hi ^ uint64(worker+1)<<40, Lo: r.base.Lo + uint64(i)}
}

func runBench(cmd *cobra.Command, g *globals, o benchOpts) error {
	r := &benchRun{o: o}
	switch o.mode {
	case modePutGet, modeLookup, modeLookupBatch, modeNop:
	case modeMix:
		m, err := parseMix(o.mix)
		if err != nil {
			return err
		}
		r.mix = m
	default:
		return fmt.Errorf("bench: unknown --mode %q (want putget, mix, lookup, lookup-batch, nop)", o.mode)
	}
	switch {
	case o.sessions < 1:
		return errors.New("bench: --sessions must be ≥ 1")
	case o.duration <= 0:
		return errors.New("bench: --duration must be > 0")
	case o.warmup < 0:
		return errors.New("bench: --warmup must be ≥ 0")
	case o.lookupChain < 1:
		return errors.New("bench: --lookup-chain must be ≥ 1")
	case o.keys < 0:
		return errors.New("bench: --keys must be ≥ 0")
	}
	var b [16]byte
	rand.Read(b[:])
	r.base = client.Hash{Hi: binary.LittleEndian.Uint64(b[:8]), Lo: binary.LittleEndian.Uint64(b[8:])}

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
	st, err := c.Stats(setup)
	if err != nil {
		return err
	}
	stAt := time.Now()
	host := hostTier(st)
	if host == nil {
		return errors.New("bench: the daemon reports no host tier")
	}
	block := uint64(o.blockSize)
	stride := (block + slotAlign - 1) / slotAlign * slotAlign
	r.keys = o.keys
	if r.keys == 0 {
		// 80% of the free space: the slack covers the slots other block
		// sizes' slabs cannot lend, so the bench does not evict other
		// users' blocks (nor push the tier past its high watermark).
		budget := (host.CapacityBytes - host.UsedBytes) * 8 / 10
		r.keys = int(max(budget, 0) / int64(stride))
	}
	if (o.mode == modePutGet || o.mode == modeMix) && r.keys < o.sessions {
		return fmt.Errorf("bench: the host tier (%s, %s used) holds fewer than %d free blocks of %s; evict or pass --keys",
			humanize.IBytes(uint64(host.CapacityBytes)), humanize.IBytes(uint64(host.UsedBytes)), o.sessions, humanize.IBytes(block))
	}

	ns := benchNamespace(block)
	if o.mode == modeLookupBatch {
		ns = lookupNamespace
	}
	ws := make([]*worker, o.sessions)
	for i := range ws {
		s, err := c.Open(setup, ns)
		if err != nil {
			return fmt.Errorf("bench: open session %d: %w", i, err)
		}
		w := &worker{id: i, s: s, rng: mrand.New(mrand.NewPCG(r.base.Lo, uint64(i)))}
		if o.mode == modePutGet || o.mode == modeMix {
			w.src, w.dst = make([]byte, block), make([]byte, block)
			fillPattern(w.src)
			copy(w.dst, w.src) // fault both buffers in before the clock runs
		}
		ws[i] = w
	}
	// Whatever happens below, leave no bench blocks behind.
	res := &benchResult{}
	defer func() {
		cctx, ccancel := g.ctx(context.Background())
		defer ccancel()
		res.Deleted = r.cleanup(cctx, ws)
	}()

	if err := r.prepare(setup, ws[0]); err != nil {
		return err
	}

	var mc *memcpyBench
	moves := o.mode == modePutGet || o.mode == modeMix
	if moves {
		region := min(max(int64(r.keys)*int64(block), 64<<20), 1<<30)
		if mc, err = newMemcpyBench(int(block), region); err != nil {
			return err
		}
		defer mc.close()
		res.Memcpy = &memcpyResult{RegionBytes: int64(len(mc.region))}
		res.Memcpy.BeforeGBPerSec = mc.run(time.Second)
	}

	evBefore := host.Evictions
	runCtx, runCancel := context.WithTimeout(ctx, o.warmup+o.duration+max(g.timeout, time.Second))
	defer runCancel()
	// Ctrl-C or the deadline stops the workers between ops.
	stopWatch := context.AfterFunc(runCtx, func() { r.stop.Store(true) })
	defer stopWatch()

	t0 := time.Now()
	r.measureStart = t0.Add(o.warmup)
	r.end = r.measureStart.Add(o.duration)
	stopBar := startProgress(cmd, g, o, t0)
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.work(runCtx, w)
		}()
	}
	wg.Wait()
	stopBar()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	if mc != nil {
		res.Memcpy.AfterGBPerSec = mc.run(time.Second)
		res.Memcpy.GBPerSec = (res.Memcpy.BeforeGBPerSec + res.Memcpy.AfterGBPerSec) / 2
	}
	r.summarize(res, ws, block)
	// A fresh deadline: setup's may have expired during the run.
	sctx, scancel := g.ctx(ctx)
	defer scancel()
	if st2, err := c.Stats(sctx); err == nil {
		if !sameDaemon(st, st2, time.Since(stAt)) {
			// Restarted during the run (under the same pid, too: PID 1 of
			// a container): the new daemon's evictions are all the run's.
			evBefore = 0
		}
		if h := hostTier(st2); h != nil {
			res.Evictions = delta(h.Evictions, evBefore)
		}
	}
	if res.Memcpy != nil && res.Memcpy.GBPerSec > 0 {
		res.RatioToMemcpy = res.GBPerSec / res.Memcpy.GBPerSec
	}
	// Delete before printing so the report includes it.
	cctx, ccancel := g.ctx(context.Background())
	res.Deleted = r.cleanup(cctx, ws)
	ccancel()
	if g.json {
		return writeJSON(stdout(cmd), res)
	}
	printBench(stdout(cmd), res)
	return nil
}

func hostTier(st *client.Stats) *shm.TierStats {
	for i := range st.Tiers {
		if st.Tiers[i].Name == "host" {
			return &st.Tiers[i]
		}
	}
	return nil
}

// prepare caches what the read-only modes read.
func (r *benchRun) prepare(ctx context.Context, w *worker) error {
	var n int
	switch r.o.mode {
	case modeLookup:
		n = 1
	case modeLookupBatch:
		n = r.o.lookupChain
	case modeMix:
		// The key space is shared by all sessions; it starts empty so puts
		// copy and early gets miss, as in a cold cache.
		r.chain = make([]client.Hash, r.keys)
		for i := range r.chain {
			r.chain[i] = r.hash(-1, i)
		}
		return nil
	default:
		return nil
	}
	r.chain = make([]client.Hash, n)
	for i := range r.chain {
		r.chain[i] = r.hash(-1, i)
	}
	blk := make([]byte, w.s.BlockBytes())
	const batch = 256
	for i := 0; i < n; i += batch {
		hs := r.chain[i:min(i+batch, n)]
		bs := make([][]byte, len(hs))
		for j := range bs {
			bs[j] = blk
		}
		if _, err := w.s.PutBatch(ctx, hs, bs); err != nil {
			return fmt.Errorf("bench: pre-populate %d keys: %w", n, err)
		}
	}
	lr, err := w.s.Lookup(ctx, r.chain)
	if err != nil {
		return fmt.Errorf("bench: pre-populate: %w", err)
	}
	if lr.Hits != n {
		return fmt.Errorf("bench: pre-populated %d keys but only %d are cached (host tier too small?)", n, lr.Hits)
	}
	return nil
}

// work is one session's loop. It times every op; only ops that start
// inside the measured window are recorded.
func (r *benchRun) work(ctx context.Context, w *worker) error {
	defer func() { w.lastEnd = time.Now() }()
	switch r.o.mode {
	case modePutGet:
		return r.putget(ctx, w)
	case modeMix:
		return r.mixLoop(ctx, w)
	}
	for !r.stop.Load() {
		t0 := time.Now()
		if t0.After(r.end) {
			return nil
		}
		var kind opKind
		switch r.o.mode {
		case modeLookup:
			kind = opLookup
			lr, err := w.s.Lookup(ctx, r.chain)
			if err != nil {
				return err
			}
			if lr.Hits != 1 {
				w.lookMiss++
			}
		case modeLookupBatch:
			kind = opLookupBatch
			lr, err := w.s.Lookup(ctx, r.chain)
			if err != nil {
				return err
			}
			if lr.Hits != len(r.chain) {
				w.lookMiss++
			}
		case modeNop:
			kind = opNop
			if err := w.s.Nop(ctx); err != nil {
				return err
			}
		}
		if !t0.Before(r.measureStart) {
			w.samples[kind] = append(w.samples[kind], int64(time.Since(t0)))
			w.ops++
			if kind == opLookupBatch {
				w.lookKeys += uint64(len(r.chain))
			}
		}
	}
	return nil
}

// putgetHook, when set (tests only), is called by putget right before a
// slot's old block is deleted (step "delete") and right after each put
// (step "put", whose error it replaces).
var putgetHook func(step string, err error) error

// putget PUTs a fresh block and GETs it back. Each session cycles through
// keys/sessions slots: the block written keysPerSession iterations ago is
// deleted just before its slot is reused, so the live working set stays at
// --keys blocks spread over the arena rather than growing until the daemon
// evicts. One delete per iteration, not a batch: freeing a slab's worth of
// slots at once makes the host tier compact (copy blocks) synchronously,
// which the PUT+GET figure must not include (see docs/benchmarks.md).
func (r *benchRun) putget(ctx context.Context, w *worker) error {
	k := max(r.keys/r.o.sessions, 1)
	ring := make([]client.Hash, k)
	used := make([]bool, k)
	defer func() {
		for i := range ring {
			if used[i] {
				w.live = append(w.live, ring[i])
			}
		}
	}()
	del := make([]client.Hash, 1)
	for i := 0; !r.stop.Load(); i++ {
		if slot := i % k; used[slot] {
			t0 := time.Now()
			del[0] = ring[slot]
			if putgetHook != nil {
				putgetHook("delete", nil)
			}
			if _, err := w.s.DeleteBatch(ctx, del); err != nil {
				// Still cached (an interrupt before the delete went
				// out): the slot stays used, so cleanup deletes it.
				return err
			}
			used[slot] = false
			// Not part of the PUT+GET figure, but its time is inside the
			// window, so show what it costs.
			if !t0.Before(r.measureStart) {
				w.samples[opDelete] = append(w.samples[opDelete], int64(time.Since(t0)))
			}
		}
		t0 := time.Now()
		if t0.After(r.end) {
			return nil
		}
		h := r.hash(w.id, i)
		po, err := r.put(ctx, w, h)
		if putgetHook != nil {
			err = putgetHook("put", err)
		}
		if err != nil {
			// The daemon may have stored h though the answer never came
			// (an interrupt while the commit was in flight): cleanup
			// deletes it if so.
			w.live = append(w.live, h)
			return err
		}
		t1 := time.Now()
		if po == putStored {
			ring[i%k], used[i%k] = h, true
		}
		hit, err := r.get(ctx, w, h)
		if err != nil {
			return err
		}
		if !t0.Before(r.measureStart) {
			t2 := time.Now()
			w.samples[opPut] = append(w.samples[opPut], int64(t1.Sub(t0)))
			w.samples[opGet] = append(w.samples[opGet], int64(t2.Sub(t1)))
			w.ops += 2
			w.book(po)
			w.bookGet(hit)
		}
	}
	return nil
}

func (r *benchRun) mixLoop(ctx context.Context, w *worker) error {
	total := r.mix.total()
	for !r.stop.Load() {
		kind := r.mix.pick(w.rng.Uint64N(total))
		h := r.chain[w.rng.IntN(len(r.chain))]
		t0 := time.Now()
		if t0.After(r.end) {
			return nil
		}
		var po putOutcome
		var hit, missLookup bool
		var err error
		switch kind {
		case opPut:
			po, err = r.put(ctx, w, h)
		case opGet:
			hit, err = r.get(ctx, w, h)
		case opLookup:
			var lr client.LookupResult
			lr, err = w.s.Lookup(ctx, []client.Hash{h})
			missLookup = err == nil && lr.Hits == 0
		}
		if err != nil {
			return err
		}
		if !t0.Before(r.measureStart) {
			w.samples[kind] = append(w.samples[kind], int64(time.Since(t0)))
			w.ops++
			switch kind {
			case opPut:
				w.book(po)
			case opGet:
				w.bookGet(hit)
			case opLookup:
				if missLookup {
					w.lookMiss++
				}
			}
		}
	}
	return nil
}

// putOutcome is what a put did.
type putOutcome int

const (
	putStored putOutcome = iota
	putDup               // already cached: the daemon answered without a copy
	putFull              // every slot leased or reserved (other sessions may hold them)
)

// put copies src into the cache under h. A full tier is an outcome, not
// an error: it is counted and the run goes on.
func (r *benchRun) put(ctx context.Context, w *worker, h client.Hash) (putOutcome, error) {
	if r.o.zeroCopy {
		res, err := w.s.Reserve(ctx, h)
		switch {
		case errors.Is(err, client.ErrFull):
			return putFull, nil
		case err != nil:
			return 0, err
		case res == nil:
			return putDup, nil
		}
		copy(res.Bytes(), w.src)
		return putStored, res.Commit(ctx)
	}
	stored, err := w.s.Put(ctx, h, w.src)
	switch {
	case errors.Is(err, client.ErrFull):
		return putFull, nil
	case err != nil:
		return 0, err
	case !stored:
		return putDup, nil
	}
	return putStored, nil
}

// book counts one measured put.
func (w *worker) book(p putOutcome) {
	switch p {
	case putStored:
		w.putStored++
		w.bytes += uint64(len(w.src))
	case putDup:
		w.putDup++
	case putFull:
		w.putFull++
	}
}

// bookGet counts one measured get.
func (w *worker) bookGet(hit bool) {
	if hit {
		w.getHits++
		w.bytes += uint64(len(w.dst))
	} else {
		w.getMisses++
	}
}

// get copies the block h into dst; false on a miss.
func (r *benchRun) get(ctx context.Context, w *worker, h client.Hash) (bool, error) {
	if r.o.zeroCopy {
		l, err := w.s.Acquire(ctx, h)
		if errors.Is(err, client.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		copy(w.dst, l.Bytes())
		return true, l.Release()
	}
	err := w.s.Get(ctx, h, w.dst)
	if errors.Is(err, client.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// cleanup deletes every block the run created and returns how many were
// still cached. Safe to call twice: the second call finds nothing.
func (r *benchRun) cleanup(ctx context.Context, ws []*worker) int {
	if len(ws) == 0 || ws[0] == nil {
		return 0
	}
	hs := append([]client.Hash(nil), r.chain...)
	for _, w := range ws {
		if w != nil {
			hs = append(hs, w.live...)
			w.live = nil
		}
	}
	r.chain = nil
	n := 0
	const batch = 512
	for i := 0; i < len(hs); i += batch {
		d, err := ws[0].s.DeleteBatch(ctx, hs[i:min(i+batch, len(hs))])
		n += d
		if err != nil {
			break
		}
	}
	return n
}

func (r *benchRun) summarize(res *benchResult, ws []*worker, block uint64) {
	o := r.o
	res.Mode, res.ZeroCopy, res.BlockBytes, res.Sessions = o.mode, o.zeroCopy, block, o.sessions
	if o.mode == modeLookupBatch {
		res.BlockBytes = lookupNamespace.BlockBytes
		res.LookupChain = o.lookupChain
	}
	if o.mode == modeMix {
		res.Mix = r.mix.String()
	}
	if o.mode == modePutGet || o.mode == modeMix {
		res.Keys = r.keys
		res.WorkingSetBytes = uint64(r.keys) * block
	}
	var last time.Time
	var all [numKinds][]int64
	var keys uint64
	for _, w := range ws {
		if w.lastEnd.After(last) {
			last = w.lastEnd
		}
		res.Ops += w.ops
		res.BytesMoved += w.bytes
		res.PutStored += w.putStored
		res.PutDup += w.putDup
		res.PutFull += w.putFull
		res.GetHits += w.getHits
		res.GetMisses += w.getMisses
		res.LookupMiss += w.lookMiss
		keys += w.lookKeys
		for k := range all {
			all[k] = append(all[k], w.samples[k]...)
		}
	}
	// The window ends when the last op that started in it finished.
	sec := last.Sub(r.measureStart).Seconds()
	res.Seconds = sec
	if sec <= 0 {
		return
	}
	res.OpsPerSec = float64(res.Ops) / sec
	res.GBPerSec = float64(res.BytesMoved) / sec / 1e9
	if o.mode == modePutGet {
		res.PairsPerSec = res.OpsPerSec / 2
	}
	if o.mode == modeLookupBatch {
		res.KeysPerSec = float64(keys) / sec
	}
	res.Latency = map[string]latency{}
	for k := range all {
		if len(all[k]) > 0 {
			res.Latency[kindNames[k]] = summarize(all[k])
		}
	}
}

func printBench(w io.Writer, res *benchResult) {
	mode := res.Mode
	if res.ZeroCopy {
		mode += " (zero-copy)"
	}
	if res.Mix != "" {
		mode += " " + res.Mix
	}
	fmt.Fprintf(w, "mode %s, block %s, %d session(s), %.2fs measured\n", mode, humanize.IBytes(res.BlockBytes), res.Sessions, res.Seconds)
	if res.Keys > 0 {
		fmt.Fprintf(w, "working set %d blocks (%s)\n", res.Keys, humanize.IBytes(res.WorkingSetBytes))
	}
	fmt.Fprintf(w, "\nops/s        %.0f\n", res.OpsPerSec)
	if res.PairsPerSec > 0 {
		fmt.Fprintf(w, "PUT+GET/s    %.0f\n", res.PairsPerSec)
	}
	if res.KeysPerSec > 0 {
		fmt.Fprintf(w, "keys/s       %.0f  (%d-key chains)\n", res.KeysPerSec, res.LookupChain)
	}
	if res.BytesMoved > 0 {
		fmt.Fprintf(w, "throughput   %.2f GB/s of block bytes in+out\n", res.GBPerSec)
	}
	if m := res.Memcpy; m != nil {
		fmt.Fprintf(w, "memcpy       %.2f GB/s single core (before %.2f, after %.2f; %s region)\n",
			m.GBPerSec, m.BeforeGBPerSec, m.AfterGBPerSec, humanize.IBytes(uint64(m.RegionBytes)))
		fmt.Fprintf(w, "ratio        %.1f%% of memcpy\n", 100*res.RatioToMemcpy)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "OP\tCOUNT\tMEAN µs\tP50 µs\tP99 µs\tP99.9 µs\tMAX µs\t")
	for _, k := range kindNames {
		l, ok := res.Latency[k]
		if !ok {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", k, l.Count, l.MeanUS, l.P50US, l.P99US, l.P999US, l.MaxUS)
	}
	tw.Flush()
	var notes []string
	if res.PutStored+res.PutDup+res.PutFull > 0 && res.Mode == modeMix {
		notes = append(notes, fmt.Sprintf("puts: %d stored, %d duplicate", res.PutStored, res.PutDup))
	}
	if res.PutFull > 0 {
		notes = append(notes, fmt.Sprintf("%d puts refused: tier full", res.PutFull))
	}
	if res.GetHits+res.GetMisses > 0 {
		notes = append(notes, fmt.Sprintf("gets: %d hits, %d misses", res.GetHits, res.GetMisses))
	}
	if res.LookupMiss > 0 {
		notes = append(notes, fmt.Sprintf("%d lookups missed", res.LookupMiss))
	}
	notes = append(notes, fmt.Sprintf("daemon evictions during run: %d", res.Evictions))
	notes = append(notes, fmt.Sprintf("bench blocks deleted: %d", res.Deleted))
	fmt.Fprintln(w)
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
}

// startProgress draws a time-based bar on stderr when it is a terminal and
// output is for humans; it returns a func that stops and clears it.
func startProgress(cmd *cobra.Command, g *globals, o benchOpts, t0 time.Time) func() {
	total := o.warmup + o.duration
	return startBar(cmd, g, total.Milliseconds(), "warmup", false, func(bar *progressbar.ProgressBar) {
		el := time.Since(t0)
		if el >= o.warmup {
			bar.Describe(o.mode)
		}
		bar.Set64(min(el, total).Milliseconds())
	})
}
