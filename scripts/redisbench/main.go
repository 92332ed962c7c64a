// Command redisbench moves the same 2 MiB blocks through Redis (over a Unix
// socket, RESP spoken directly) and through kvtier's host tier (the Go
// client library), at equal concurrency, in one run, and prints the ratio.
// scripts/bench-redis.sh starts both servers and runs it.
//
// Both sides do the same work per iteration, like `kvtierctl bench`
// (putget): store a fresh block from a client buffer under a fresh key,
// then fetch it back into another client buffer. Each worker cycles through
// keys/concurrency key slots and deletes the block written keys/concurrency
// iterations earlier just before reusing its slot, so the live working set
// stays at -keys blocks. GB/s counts the block bytes moved: 2 blocks per
// SET+GET (PUT+GET) pair.
//
//   - redis: SET key <block> (the block is written straight from the
//     client buffer with writev), GET key (read straight into the
//     destination buffer), DEL key. One connection per worker.
//   - kvtier: Session.Put / Session.Get (copying calls), Session.Delete.
//     One session per worker.
//   - kvtier-zc: Reserve+copy+Commit / Acquire+copy+Release (zero-copy
//     calls: the caller does the one copy each way). Reported separately.
//
// Every side first stores and fetches one block and compares the bytes.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kvtier/kvtier/client"
)

func main() {
	redisSock := flag.String("redis", "", "Redis unix socket")
	kvSock := flag.String("kvtier", "", "kvtierd control socket")
	block := flag.Int("block", 2<<20, "block bytes")
	concs := flag.String("concurrency", "1,4", "comma-separated worker counts")
	dur := flag.Duration("duration", 5*time.Second, "measured time per run")
	warm := flag.Duration("warmup", time.Second, "unmeasured time before each run")
	keys := flag.Int("keys", 256, "live working set in blocks (split over the workers)")
	rounds := flag.Int("rounds", 1, "repeat every (concurrency, side) run this many times, interleaved; the median is reported")
	sideList := flag.String("sides", "redis,kvtier,kvtier-zc", "comma-separated sides to run (the ratio needs redis)")
	flag.Parse()
	if *redisSock == "" || *kvSock == "" {
		fmt.Fprintln(os.Stderr, "usage: redisbench -redis SOCK -kvtier SOCK [flags]")
		os.Exit(2)
	}
	var cs []int
	for _, f := range strings.Split(*concs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fatal(fmt.Errorf("bad -concurrency %q", *concs))
		}
		cs = append(cs, n)
	}
	ctx := context.Background()
	kc, err := client.Dial(ctx, client.Options{Socket: *kvSock, Name: "redisbench"})
	if err != nil {
		fatal(err)
	}
	defer kc.Close()
	cfg := config{block: *block, dur: *dur, warm: *warm, keys: *keys, redis: *redisSock, kv: kc}

	sides := strings.Split(*sideList, ",")
	for _, sd := range sides {
		if sd != "redis" && sd != "kvtier" && sd != "kvtier-zc" {
			fatal(fmt.Errorf("unknown side %q in -sides", sd))
		}
	}
	type key struct {
		side string
		conc int
	}
	all := map[key][]result{}
	for round := 0; round < *rounds; round++ {
		for _, c := range cs {
			for _, side := range sides {
				r, err := cfg.run(ctx, side, c, round)
				if err != nil {
					fatal(fmt.Errorf("%s, %d workers: %w", side, c, err))
				}
				fmt.Fprintf(os.Stderr, "round %d: %-9s x%d: %.2f GB/s\n", round+1, side, c, r.gbps)
				all[key{side, c}] = append(all[key{side, c}], r)
			}
		}
	}
	fmt.Printf("block %d B, working set %d blocks, %v per run (+%v warm-up), %d round(s), median shown\n\n", *block, *keys, *dur, *warm, *rounds)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workers\tside\tpairs/s\tGB/s\tstore p50\tfetch p50\tstore p99\tfetch p99\tvs redis\t")
	for _, c := range cs {
		red := 0.0
		if rs := all[key{"redis", c}]; len(rs) > 0 {
			red = median(rs).gbps
		}
		for _, side := range sides {
			r := median(all[key{side, c}])
			ratio := "—"
			if red > 0 {
				ratio = fmt.Sprintf("%.2f×", r.gbps/red)
			}
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.2f\t%v\t%v\t%v\t%v\t%s\t\n", c, side, r.pairs, r.gbps,
				r.putP50, r.getP50, r.putP99, r.getP99, ratio)
		}
	}
	tw.Flush()
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "redisbench:", err)
	os.Exit(1)
}

type config struct {
	block, keys int
	dur, warm   time.Duration
	redis       string
	kv          *client.Client
}

type result struct {
	pairs, gbps                    float64
	putP50, getP50, putP99, getP99 time.Duration
}

func median(rs []result) result {
	sort.Slice(rs, func(i, j int) bool { return rs[i].gbps < rs[j].gbps })
	return rs[len(rs)/2]
}

// store/fetch/drop are one side's operations for one worker.
type ops interface {
	store(key uint64, src []byte) error
	fetch(key uint64, dst []byte) error
	drop(key uint64) error
	close()
}

func (cfg *config) open(ctx context.Context, side string) (ops, error) {
	switch side {
	case "redis":
		c, err := net.Dial("unix", cfg.redis)
		if err != nil {
			return nil, err
		}
		return &respConn{c: c, r: bufio.NewReaderSize(c, 64<<10)}, nil
	case "kvtier", "kvtier-zc":
		s, err := cfg.kv.Open(ctx, benchNS(uint64(cfg.block)))
		if err != nil {
			return nil, err
		}
		return &kvOps{ctx: ctx, s: s, zc: side == "kvtier-zc"}, nil
	}
	return nil, fmt.Errorf("unknown side %q", side)
}

func (cfg *config) run(ctx context.Context, side string, conc, round int) (result, error) {
	ws := make([]ops, conc)
	for i := range ws {
		o, err := cfg.open(ctx, side)
		if err != nil {
			return result{}, err
		}
		defer o.close()
		ws[i] = o
	}
	// Correctness first: one block in and back out, byte for byte.
	src, dst := pattern(cfg.block, uint64(round)), make([]byte, cfg.block)
	probe := uint64(1)<<63 | uint64(round)
	if err := ws[0].store(probe, src); err != nil {
		return result{}, fmt.Errorf("probe store: %w", err)
	}
	if err := ws[0].fetch(probe, dst); err != nil {
		return result{}, fmt.Errorf("probe fetch: %w", err)
	}
	if !bytes.Equal(src, dst) {
		return result{}, errors.New("probe: fetched bytes differ from the stored ones")
	}
	if err := ws[0].drop(probe); err != nil {
		return result{}, err
	}

	k := max(cfg.keys/conc, 1)
	start := time.Now()
	measure, end := start.Add(cfg.warm), start.Add(cfg.warm+cfg.dur)
	var pairs atomic.Int64
	var mu sync.Mutex
	var putLat, getLat []time.Duration
	errs := make([]error, conc)
	var wg sync.WaitGroup
	for w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := ws[w]
			src, dst := pattern(cfg.block, uint64(w+1)), make([]byte, cfg.block)
			copy(dst, src)
			base := uint64(round)<<48 | uint64(conc)<<40 | uint64(w)<<32
			used := make([]bool, k)
			var pl, gl []time.Duration
			n := 0
			defer func() {
				for s := range used { // leave nothing behind
					if used[s] {
						o.drop(base | uint64(s))
					}
				}
				mu.Lock()
				putLat, getLat = append(putLat, pl...), append(getLat, gl...)
				mu.Unlock()
			}()
			for i := 0; ; i++ {
				slot := i % k
				key := base | uint64(slot)
				if used[slot] {
					if err := o.drop(key); err != nil {
						errs[w] = err
						return
					}
					used[slot] = false
				}
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				src[0] = byte(i) // every stored block differs from the last
				if err := o.store(key, src); err != nil {
					errs[w] = err
					return
				}
				used[slot] = true
				t1 := time.Now()
				if err := o.fetch(key, dst); err != nil {
					errs[w] = err
					return
				}
				if dst[0] != byte(i) {
					errs[w] = fmt.Errorf("fetched an old block")
					return
				}
				if !t0.Before(measure) {
					pl, gl = append(pl, t1.Sub(t0)), append(gl, time.Since(t1))
					n++
				}
			}
			pairs.Add(int64(n))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	el := cfg.dur.Seconds()
	r := result{pairs: float64(pairs.Load()) / el}
	r.gbps = r.pairs * 2 * float64(cfg.block) / 1e9
	r.putP50, r.putP99 = pct(putLat, 0.5), pct(putLat, 0.99)
	r.getP50, r.getP99 = pct(getLat, 0.5), pct(getLat, 0.99)
	return r, nil
}

func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(int(float64(len(d))*q), len(d)-1)].Round(time.Microsecond)
}

// pattern returns non-repeating bytes (no layer can shortcut zeros).
func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	x := seed*0x9e3779b97f4a7c15 | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

// ---- kvtier side ----

// benchNS is kvtierctl bench's namespace: a Llama-3-8B-like layout (2 MiB
// = 16 tokens of 2 × 32 layers × 8 kv heads × 128 dims × fp16).
func benchNS(block uint64) client.Namespace {
	const tokenBytes = 2 * 32 * 8 * 128 * 2
	ns := client.Namespace{ModelID: "redisbench", DType: "fp16", TPSize: 1, BlockBytes: block,
		Layers: 1, KVHeads: 1, HeadDim: 1, TokensPerBlock: uint32(max(block/4, 1))}
	if block%tokenBytes == 0 {
		ns.Layers, ns.KVHeads, ns.HeadDim, ns.TokensPerBlock = 32, 8, 128, uint32(block/tokenBytes)
	}
	return ns
}

type kvOps struct {
	ctx context.Context
	s   *client.Session
	zc  bool
}

func kvHash(key uint64) client.Hash { return client.Hash{Hi: 0x7265646973 ^ key, Lo: key} }

func (k *kvOps) store(key uint64, src []byte) error {
	h := kvHash(key)
	if k.zc {
		r, err := k.s.Reserve(k.ctx, h)
		if err != nil {
			return err
		}
		if r == nil {
			return errors.New("key already cached")
		}
		copy(r.Bytes(), src)
		return r.Commit(k.ctx)
	}
	stored, err := k.s.Put(k.ctx, h, src)
	if err == nil && !stored {
		err = errors.New("key already cached")
	}
	return err
}

func (k *kvOps) fetch(key uint64, dst []byte) error {
	h := kvHash(key)
	if k.zc {
		l, err := k.s.Acquire(k.ctx, h)
		if err != nil {
			return err
		}
		copy(dst, l.Bytes())
		return l.Release()
	}
	return k.s.Get(k.ctx, h, dst)
}

func (k *kvOps) drop(key uint64) error {
	_, err := k.s.Delete(k.ctx, kvHash(key))
	return err
}

func (k *kvOps) close() { k.s.Close() }

// ---- Redis side: a minimal RESP2 client ----

type respConn struct {
	c   net.Conn
	r   *bufio.Reader
	hdr []byte
}

var crlf = []byte("\r\n")

func redisKey(key uint64) string { return "kvb:" + strconv.FormatUint(key, 16) }

// command writes a RESP array of bulk strings; the last argument, if val
// is set, is val itself, written from the caller's buffer (writev).
func (r *respConn) command(val []byte, args ...string) error {
	n := len(args)
	if val != nil {
		n++
	}
	h := fmt.Appendf(r.hdr[:0], "*%d\r\n", n)
	for _, a := range args {
		h = fmt.Appendf(h, "$%d\r\n%s\r\n", len(a), a)
	}
	if val == nil {
		r.hdr = h
		_, err := r.c.Write(h)
		return err
	}
	h = fmt.Appendf(h, "$%d\r\n", len(val))
	r.hdr = h
	bufs := net.Buffers{h, val, crlf}
	_, err := bufs.WriteTo(r.c)
	return err
}

func (r *respConn) line() (string, error) {
	l, err := r.r.ReadSlice('\n')
	if err != nil {
		return "", err
	}
	s := strings.TrimSuffix(string(l), "\r\n")
	if strings.HasPrefix(s, "-") {
		return "", fmt.Errorf("redis: %s", s[1:])
	}
	return s, nil
}

func (r *respConn) store(key uint64, src []byte) error {
	if err := r.command(src, "SET", redisKey(key)); err != nil {
		return err
	}
	l, err := r.line()
	if err == nil && l != "+OK" {
		err = fmt.Errorf("SET: %q", l)
	}
	return err
}

func (r *respConn) fetch(key uint64, dst []byte) error {
	if err := r.command(nil, "GET", redisKey(key)); err != nil {
		return err
	}
	l, err := r.line()
	if err != nil {
		return err
	}
	if l != "$"+strconv.Itoa(len(dst)) {
		return fmt.Errorf("GET: %q, want a %d-byte bulk string", l, len(dst))
	}
	// bufio reads a request larger than its buffer straight into dst.
	if _, err := io.ReadFull(r.r, dst); err != nil {
		return err
	}
	var end [2]byte
	_, err = io.ReadFull(r.r, end[:])
	return err
}

func (r *respConn) drop(key uint64) error {
	if err := r.command(nil, "DEL", redisKey(key)); err != nil {
		return err
	}
	l, err := r.line()
	if err == nil && l != ":1" {
		err = fmt.Errorf("DEL: %q", l)
	}
	return err
}

func (r *respConn) close() { r.c.Close() }
