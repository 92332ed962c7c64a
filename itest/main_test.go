// Package itest holds kvtier's integration and hostile-peer tests.
//
// Real-process tests use the helper-process pattern: the test binary re-runs
// itself with KVTIER_ITEST_ROLE set, and TestMain then acts as the daemon
// ("daemon") or as a client process ("client") instead of running tests.
// Children talk to the parent through stdout lines ("READY", "PUT ...").
package itest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
)

const (
	roleEnv = "KVTIER_ITEST_ROLE"

	// daemon role
	envDir      = "KVTIER_ITEST_DIR"      // runtime dir; the state dir is <dir>/state unless envState
	envState    = "KVTIER_ITEST_STATE"    // state dir
	envCapacity = "KVTIER_ITEST_CAPACITY" // host tier size, e.g. 64MiB
	envSlab     = "KVTIER_ITEST_SLAB"     // slab size in bytes
	envUIDs     = "KVTIER_ITEST_UIDS"     // comma-separated allowed uids (gids then empty)
	envNVMe     = "KVTIER_ITEST_NVME"     // NVMe tier capacity, e.g. 256MiB; unset = host tier only
	envMetrics  = "KVTIER_ITEST_METRICS"  // metrics listen address (e.g. 127.0.0.1:0); the bound one goes to <dir>/metrics.addr
	// envListenSelf=1 sets LISTEN_PID to the daemon's own pid (which the
	// parent cannot know before the fork), so fds passed like systemd's fd
	// store (LISTEN_FDS, ExtraFiles) are taken; see warm_test.go.
	envListenSelf = "KVTIER_ITEST_LISTEN_SELF"

	// client role
	envSocket = "KVTIER_ITEST_SOCKET"
	envOp     = "KVTIER_ITEST_OP"    // put | verify | hold | load (evidence_test.go)
	envSeed   = "KVTIER_ITEST_SEED"  // hash chain seed of the blocks to put/verify/reserve
	envSeed2  = "KVTIER_ITEST_SEED2" // hash chain seed of the blocks to lease (hold)
	envN      = "KVTIER_ITEST_N"     // blocks to put/verify/reserve
	envM      = "KVTIER_ITEST_M"     // blocks to lease (hold)
	envBlock  = "KVTIER_ITEST_BLOCK" // namespace block size
)

func TestMain(m *testing.M) {
	switch role := os.Getenv(roleEnv); role {
	case "":
	case "daemon":
		os.Exit(daemonRole())
	case "client":
		os.Exit(clientRole())
	case "gpuclient":
		os.Exit(gpuClientRole()) // gpu_test.go
	default:
		fmt.Fprintf(os.Stderr, "unknown %s %q\n", roleEnv, role)
		os.Exit(2)
	}
	goleak.VerifyTestMain(m)
}

// ---- roles (run in child processes) ----

func daemonRole() int {
	dir := os.Getenv(envDir)
	state := os.Getenv(envState)
	if state == "" {
		state = filepath.Join(dir, "state")
	}
	capacity := os.Getenv(envCapacity)
	if capacity == "" {
		capacity = "64MiB"
	}
	// The default slab (64MiB) needs two slabs; size the tier after loading.
	cfg, err := daemon.LoadFromArgs([]string{"-runtime-dir", dir, "-state-dir", state, "-host-capacity", "128MiB", "-log-level", "debug", "-metrics-listen", os.Getenv(envMetrics)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "config:", err)
		return 2
	}
	if err := cfg.Host.Capacity.Set(capacity); err != nil {
		fmt.Fprintln(os.Stderr, "capacity:", err)
		return 2
	}
	cfg.Host.SlabBytes = 4 << 20
	if s := os.Getenv(envSlab); s != "" {
		v, _ := strconv.ParseUint(s, 10, 64)
		cfg.Host.SlabBytes = daemon.ByteSize(v)
	}
	// Tests of the host tier alone keep the NVMe tier out of the way.
	cfg.NVMe.Enabled = false
	if v := os.Getenv(envNVMe); v != "" {
		cfg.NVMe.Enabled = true
		if err := cfg.NVMe.Capacity.Set(v); err != nil {
			fmt.Fprintln(os.Stderr, "nvme capacity:", err)
			return 2
		}
	}
	configureGPU(&cfg) // gpu_test.go
	if u := os.Getenv(envUIDs); u != "" {
		cfg.Auth.UIDs, cfg.Auth.GIDs = nil, nil
		for _, f := range strings.Split(u, ",") {
			v, _ := strconv.ParseUint(f, 10, 32)
			cfg.Auth.UIDs = append(cfg.Auth.UIDs, uint32(v))
		}
	}
	if os.Getenv(envListenSelf) == "1" {
		os.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		fmt.Fprintln(os.Stderr, "new:", err)
		return 1
	}
	if a := d.MetricsAddr(); a != nil {
		if err := os.WriteFile(filepath.Join(dir, "metrics.addr"), []byte(a.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "metrics addr:", err)
			return 1
		}
	}
	fmt.Printf("READY %d\n", os.Getpid())
	if err := d.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		return 1
	}
	return 0
}

func clientRole() int {
	fail := func(format string, args ...any) int {
		fmt.Printf("FAIL "+format+"\n", args...)
		return 1
	}
	ctx := context.Background()
	n, _ := strconv.Atoi(os.Getenv(envN))
	m, _ := strconv.Atoi(os.Getenv(envM))
	bs, _ := strconv.Atoi(os.Getenv(envBlock))
	seed, _ := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	seed2, _ := strconv.ParseUint(os.Getenv(envSeed2), 10, 64)
	c, err := client.Dial(ctx, client.Options{Socket: os.Getenv(envSocket), Name: "itest-child"})
	if err != nil {
		return fail("dial: %v", err)
	}
	defer c.Close()
	s, err := c.Open(ctx, testNS("itest", bs))
	if err != nil {
		return fail("open: %v", err)
	}
	hs := chain(seed, n)
	switch op := os.Getenv(envOp); op {
	case "put":
		blocks := make([][]byte, n)
		for i, h := range hs {
			blocks[i] = payload(h, bs)
		}
		stored, err := s.PutBatch(ctx, hs, blocks)
		if err != nil {
			return fail("put: %v", err)
		}
		fmt.Printf("PUT %d %d\n", s.NamespaceID(), stored)
	case "verify":
		r, err := s.Lookup(ctx, hs)
		if err != nil {
			return fail("lookup: %v", err)
		}
		dsts := make([][]byte, n)
		for i := range dsts {
			dsts[i] = make([]byte, bs)
		}
		found, err := s.GetBatch(ctx, hs, dsts)
		if err != nil {
			return fail("get: %v", err)
		}
		ok := 0
		for i := range hs {
			if found[i] && bytes.Equal(dsts[i], payload(hs[i], bs)) {
				ok++
			}
		}
		fmt.Printf("VERIFY %d %d %d\n", s.NamespaceID(), r.Hits, ok)
	case "hold":
		rs, err := s.ReserveBatch(ctx, hs)
		if err != nil {
			return fail("reserve: %v", err)
		}
		for i, r := range rs {
			if r == nil {
				return fail("reservation %d missing", i)
			}
			copy(r.Bytes(), payload(hs[i], bs)) // uncommitted: must never become visible
		}
		ls, err := s.AcquireBatch(ctx, chain(seed2, m))
		if err != nil {
			return fail("acquire: %v", err)
		}
		for i, l := range ls {
			if l == nil {
				return fail("lease %d missing", i)
			}
		}
		fmt.Println("READY")
		time.Sleep(time.Hour) // until the parent kills us
	case "load":
		return loadRole(ctx, s, bs, seed, n, seed2, m, fail)
	default:
		return fail("unknown op %q", op)
	}
	return 0
}

// ---- shared helpers ----

// testNS is the namespace the tests use; model distinguishes namespaces.
func testNS(model string, blockBytes int) client.Namespace {
	return client.Namespace{ModelID: model, Layers: 2, KVHeads: 4, HeadDim: 64, DType: "fp16",
		TokensPerBlock: 16, TPSize: 1, BlockBytes: uint64(blockBytes)}
}

// chain returns n chained block hashes; different seeds give disjoint chains.
func chain(seed uint64, n int) []client.Hash {
	toks := make([]uint32, 16*n)
	for i := range toks {
		toks[i] = uint32(i)
	}
	return client.ChainHashes(client.Hash{Hi: seed, Lo: ^seed}, toks, 16)
}

// payload is the block content for hash h: every put of h writes these bytes,
// so any successful get can be verified without knowing who wrote it.
func payload(h client.Hash, n int) []byte {
	b := make([]byte, n)
	fillPayload(b, h)
	return b
}

func fillPayload(b []byte, h client.Hash) {
	x := h.Hi ^ (h.Lo<<1 | h.Lo>>63)
	i := 0
	for ; i+8 <= len(b); i += 8 {
		// splitmix64
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

// tmpDir returns a short directory (socket paths must stay under 108 bytes).
func tmpDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", "kvt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func socketOf(dir string) string { return filepath.Join(dir, "kvtierd.sock") }

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a child process of this test binary.
type proc struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	lines  chan string
	stderr *syncBuffer
	done   chan struct{}
	err    error // Wait's result, valid after done
}

// startProc runs this binary in role with env and waits for a line starting
// with ready (skipped when empty).
func startProc(t testing.TB, name, role string, env map[string]string, ready string) *proc {
	t.Helper()
	return startProcFiles(t, name, role, env, ready, nil)
}

// startProcFiles is startProc passing files as fds 3, 4, ...
func startProcFiles(t testing.TB, name, role string, env map[string]string, ready string, files []*os.File) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.ExtraFiles = files
	// Race-enabled children would sleep 1s at exit (atexit_sleep_ms).
	cmd.Env = append(os.Environ(), roleEnv+"="+role, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=20"))
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, cmd: cmd, lines: make(chan string, 64), stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody listens; never block the child
			}
		}
		io.Copy(io.Discard, out)
	}()
	go func() {
		<-scanDone // Wait closes the pipe; read it to the end first
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s (pid %d) stderr:\n%s", name, cmd.Process.Pid, p.stderr.String())
		}
	})
	if ready != "" {
		p.expect(ready, 20*time.Second)
	}
	return p
}

// expect waits for a stdout line starting with prefix and returns it.
func (p *proc) expect(prefix string, d time.Duration) string {
	p.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				<-p.done
				p.t.Fatalf("%s exited (%v) before printing %q; stderr:\n%s", p.name, p.err, prefix, p.stderr.String())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
			if strings.HasPrefix(l, "FAIL") {
				p.t.Fatalf("%s: %s", p.name, l)
			}
		case <-timer.C:
			p.t.Fatalf("%s: no %q line within %v; stderr:\n%s", p.name, prefix, d, p.stderr.String())
		}
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// signal sends sig and waits up to d for the exit; it returns the exit error.
func (p *proc) signal(sig syscall.Signal, d time.Duration) error {
	p.t.Helper()
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.t.Fatalf("%s did not exit within %v of %v; stderr:\n%s", p.name, d, sig, p.stderr.String())
		return nil
	}
}

// wait waits up to d for the process to exit by itself.
func (p *proc) wait(d time.Duration) error {
	p.t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.t.Fatalf("%s did not exit within %v", p.name, d)
		return nil
	}
}

// kill ends the process if it still runs and reaps it.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
}

// daemonProc starts a kvtierd child serving dir; extra env overrides.
func daemonProc(t testing.TB, dir string, extra map[string]string) *proc {
	t.Helper()
	env := map[string]string{envDir: dir}
	for k, v := range extra {
		env[k] = v
	}
	return startProc(t, "kvtierd", "daemon", env, "READY")
}

// clientProc starts a client child running op.
func clientProc(t testing.TB, socket, op string, bs int, seed uint64, n int, env map[string]string, ready string) *proc {
	t.Helper()
	e := map[string]string{envSocket: socket, envOp: op, envBlock: strconv.Itoa(bs),
		envSeed: strconv.FormatUint(seed, 10), envN: strconv.Itoa(n)}
	for k, v := range env {
		e[k] = v
	}
	return startProc(t, "client-"+op, "client", e, ready)
}

// inProc runs a daemon in this process; it stops at test cleanup.
type inProc struct {
	cfg    daemon.Config
	d      *daemon.Daemon
	cancel context.CancelFunc
	done   chan error
	log    *syncBuffer
}

func startInProc(t testing.TB, capacity string, slab daemon.ByteSize, adjust func(*daemon.Config)) *inProc {
	t.Helper()
	dir := tmpDir(t)
	cfg, err := daemon.LoadFromArgs([]string{"-runtime-dir", dir, "-state-dir", filepath.Join(dir, "state"), "-host-capacity", "128MiB", "-metrics-listen", ""})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Host.Capacity.Set(capacity); err != nil {
		t.Fatal(err)
	}
	cfg.Host.SlabBytes = slab
	cfg.NVMe.Enabled = false // tests that want the NVMe tier turn it on in adjust
	if adjust != nil {
		adjust(&cfg)
	}
	lb := &syncBuffer{}
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ip := &inProc{cfg: cfg, d: d, cancel: cancel, done: make(chan error, 1), log: lb}
	go func() { ip.done <- d.Run(ctx) }()
	t.Cleanup(func() {
		if err := ip.stop(10 * time.Second); err != nil {
			t.Errorf("daemon stop: %v", err)
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", lb.String())
		}
	})
	return ip
}

// stop cancels Run and waits for it (idempotent).
func (ip *inProc) stop(d time.Duration) error {
	ip.cancel()
	select {
	case err, ok := <-ip.done:
		if ok {
			close(ip.done)
		}
		return err
	case <-time.After(d):
		return errors.New("daemon Run did not return")
	}
}

func dial(t testing.TB, socket string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Socket: socket, Name: t.Name()})
	if err != nil {
		t.Fatalf("dial %s: %v", socket, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func open(t testing.TB, c *client.Client, ns client.Namespace) *client.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Open(ctx, ns)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func stats(t testing.TB, c *client.Client) *client.Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	return st
}

// waitStats polls Stats until cond holds or d passes; it returns the last
// snapshot and how long it took.
func waitStats(t testing.TB, c *client.Client, d time.Duration, cond func(*client.Stats) bool) (*client.Stats, time.Duration, bool) {
	t.Helper()
	t0 := time.Now()
	for {
		st := stats(t, c)
		if cond(st) {
			return st, time.Since(t0), true
		}
		if time.Since(t0) > d {
			return st, time.Since(t0), false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// roundTrip puts a fresh block through s and reads it back byte for byte.
func roundTrip(t testing.TB, s *client.Session, seed uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := chain(seed, 1)[0]
	want := payload(h, s.BlockBytes())
	if stored, err := s.Put(ctx, h, want); err != nil || !stored {
		t.Fatalf("round trip put: stored=%v err=%v", stored, err)
	}
	got := make([]byte, s.BlockBytes())
	if err := s.Get(ctx, h, got); err != nil {
		t.Fatalf("round trip get: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("round trip: block bytes differ")
	}
	if ok, err := s.Delete(ctx, h); err != nil || !ok {
		t.Fatalf("round trip delete: ok=%v err=%v", ok, err)
	}
}
