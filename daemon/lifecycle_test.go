package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// testConfig is a small daemon config under t.TempDir(): an 8MiB host tier
// in 1MiB slabs, no NVMe tier, no metrics endpoint.
func testConfig(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	c, err := fakeEnv(os.Geteuid(), nil, bigMem).load("", func(c *Config) {
		c.RuntimeDir = filepath.Join(dir, "run")
		c.StateDir = filepath.Join(dir, "state")
		c.Host.Capacity, c.Host.SlabBytes, c.Host.Prefault = 8*MiB, MiB, false
		c.NVMe.Enabled = false
		c.Metrics.Listen = ""
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

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

// running is a daemon served by Run in a goroutine.
type running struct {
	d      *Daemon
	cancel context.CancelFunc
	done   chan error
}

// dialDaemon connects a client to the daemon of cfg; the client is closed
// when the test ends, before the daemon stops.
func dialDaemon(t *testing.T, cfg Config) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), client.Options{Socket: cfg.Socket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func startDaemon(t *testing.T, cfg Config, log *slog.Logger) *running {
	t.Helper()
	return startDaemonWith(t, cfg, log, nil)
}

// startDaemonWith is startDaemon with set, if not nil, applied to the
// daemon before it runs.
func startDaemonWith(t *testing.T, cfg Config, log *slog.Logger, set func(*Daemon)) *running {
	t.Helper()
	if log == nil {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	d, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if set != nil {
		set(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{d: d, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- d.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run and waits for it (at most 30s); it returns how long
// Run took to return. Calling it again returns 0.
func (r *running) stop(t *testing.T) time.Duration {
	t.Helper()
	if r.done == nil {
		return 0
	}
	t0 := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of cancel")
	}
	r.done = nil
	return time.Since(t0)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testNamespace(blockBytes int) client.Namespace {
	return client.Namespace{ModelID: "lifecycle", Layers: 1, KVHeads: 1, HeadDim: 64, DType: "bf16",
		TokensPerBlock: 16, TPSize: 1, BlockBytes: uint64(blockBytes)}
}

func testHash(i int) client.Hash {
	return client.HashBlock(client.Hash{}, []uint32{uint32(i), 7, 7, 7})
}

// putBlocks stores n blocks (0..n-1) of the session's block size.
func putBlocks(t *testing.T, s *client.Session, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		b := bytes.Repeat([]byte{byte(i + 1)}, s.BlockBytes())
		if _, err := s.Put(ctx, testHash(i), b); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
}

// TestShutdownDrains measures the SIGTERM path (Run's ctx cancelled) with a
// session busy on the ring: it ends within a bound, refuses new sessions,
// ends the busy session with an error rather than a hang, writes the host
// tier down to NVMe and closes Badger (the store reopens with the blocks).
func TestShutdownDrains(t *testing.T) {
	cfg := testConfig(t)
	cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 64*MiB, true
	r := startDaemon(t, cfg, nil)
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: cfg.Socket, Name: "drain-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, testNamespace(64*KiB))
	if err != nil {
		t.Fatal(err)
	}
	const blocks = 32 // 2MiB: under the host tier's high watermark, so only the flush writes them down
	putBlocks(t, s, blocks)

	// A client busy with ops while the daemon stops.
	busyErr := make(chan error, 1)
	go func() {
		dst := make([]byte, s.BlockBytes())
		for i := 0; ; i++ {
			if err := s.Get(ctx, testHash(i%blocks), dst); err != nil {
				busyErr <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)

	took := r.stop(t)
	t.Logf("drain took %v", took)
	// The bound of the systemd unit is 90s (TimeoutStopSec); a small idle
	// daemon must be far below it.
	if took > 5*time.Second {
		t.Errorf("shutdown took %v, want < 5s", took)
	}
	select {
	case err := <-busyErr:
		t.Logf("busy session ended with: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a session busy during shutdown was left hanging")
	}
	// No new sessions: the socket is gone.
	if _, err := net.Dial("unixpacket", cfg.Socket); err == nil {
		t.Error("the socket still accepts connections after Run returned")
	}
	if _, err := os.Stat(cfg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
	// Badger was closed (its lock is free) and holds the written-down tier.
	st, err := nvme.Open(ctx, nvme.Options{Dir: filepath.Join(cfg.StateDir, "nvme"), CapacityBytes: 64 * MiB,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("reopen nvme tier: %v", err)
	}
	defer st.Close()
	if n := st.Stats().Blocks; n != blocks {
		t.Errorf("nvme tier holds %d blocks after shutdown, want the %d written down", n, blocks)
	}
}

// TestSecondDaemonRefused: a second kvtierd on the same state dir, or on
// the same socket with another state dir, refuses to start and says why.
func TestSecondDaemonRefused(t *testing.T) {
	cfg := testConfig(t)
	startDaemon(t, cfg, nil)

	t.Run("same state dir", func(t *testing.T) {
		other := cfg
		other.RuntimeDir = filepath.Join(t.TempDir(), "run")
		other.Socket = filepath.Join(other.RuntimeDir, socketName)
		_, err := New(other, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), "another kvtierd holds the state dir "+cfg.StateDir) {
			t.Fatalf("New = %v, want the state lock refusal", err)
		}
	})
	t.Run("same socket", func(t *testing.T) {
		other := cfg
		other.StateDir = filepath.Join(t.TempDir(), "state")
		_, err := New(other, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), "another kvtierd is serving "+cfg.Socket) {
			t.Fatalf("New = %v, want the live socket refusal", err)
		}
	})
	// The first daemon is unharmed: its socket still answers.
	c, err := client.Dial(context.Background(), client.Options{Socket: cfg.Socket})
	if err != nil {
		t.Fatalf("first daemon no longer answers: %v", err)
	}
	c.Close()
}

// TestSocketPathNotASocket: a socket path that names an existing file that
// is not a socket (a mistyped path: the registry, a config file) is refused
// and the file left alone. It used to be removed as a stale socket (an
// empty directory too).
func TestSocketPathNotASocket(t *testing.T) {
	for _, name := range []string{"regular file", "empty directory"} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			if err := os.MkdirAll(cfg.RuntimeDir, 0o750); err != nil {
				t.Fatal(err)
			}
			cfg.Socket = filepath.Join(cfg.RuntimeDir, "precious")
			var err error
			switch name {
			case "regular file":
				err = os.WriteFile(cfg.Socket, []byte("keep me"), 0o640)
			case "empty directory":
				err = os.Mkdir(cfg.Socket, 0o750)
			}
			if err != nil {
				t.Fatal(err)
			}
			before, _ := os.Lstat(cfg.Socket)
			d, err := New(cfg, slog.New(slog.DiscardHandler))
			if err == nil {
				d.closeResources()
				t.Fatal("New listened on a path held by a file that is not a socket")
			}
			if !strings.Contains(err.Error(), "not a socket") {
				t.Errorf("New = %v, want a refusal saying the path is not a socket", err)
			}
			after, lerr := os.Lstat(cfg.Socket)
			if lerr != nil || after.Mode() != before.Mode() {
				t.Errorf("the file at the socket path was removed or replaced: %v", lerr)
			}
		})
	}
}

// TestSocketPathLiveStreamSocket: a socket path that names a socket
// another program listens on with another type (a mistyped -socket naming,
// say, a SOCK_STREAM service's socket) is refused and the socket left
// alone. Its connect fails with EPROTOTYPE, not ECONNREFUSED, and it used
// to be removed as stale: the other program lost its socket. A stale
// socket (nobody listens) is still replaced.
func TestSocketPathLiveStreamSocket(t *testing.T) {
	for _, tt := range []struct {
		name    string
		live    bool // a SOCK_STREAM listener holds it; else a stale socket
		refused bool
	}{
		{"live stream socket", true, true},
		{"stale socket", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			if err := os.MkdirAll(cfg.RuntimeDir, 0o750); err != nil {
				t.Fatal(err)
			}
			cfg.Socket = filepath.Join(cfg.RuntimeDir, "other.sock")
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Socket, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			if tt.live {
				defer ln.Close()
			} else {
				ln.SetUnlinkOnClose(false)
				ln.Close() // the file stays, nobody listens
			}
			d, err := New(cfg, slog.New(slog.DiscardHandler))
			if !tt.refused {
				if err != nil {
					t.Fatalf("New on a stale socket = %v", err)
				}
				d.closeResources()
				return
			}
			if err == nil {
				d.closeResources()
				t.Fatal("New replaced the live socket of another program")
			}
			if !strings.Contains(err.Error(), "in use") {
				t.Errorf("New = %v, want a refusal saying the socket is in use", err)
			}
			c, err := net.Dial("unix", cfg.Socket)
			if err != nil {
				t.Fatalf("the other program's socket no longer answers: %v", err)
			}
			c.Close()
		})
	}
}

// TestRuntimeDirOfAnotherUser: the socket's directory must be the
// daemon's (or root's) and not writable by everyone, else its owner (or
// anyone) can swap the socket for one of their own and be the daemon the
// clients talk to (clients do not check the daemon's credentials): they
// would read its blocks and hand it theirs. The embedded default for a user
// without $XDG_RUNTIME_DIR is /tmp/kvtier-<uid>, a name any local user can
// create first; kvtierd used to serve in such a directory.
func TestRuntimeDirOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a directory owned by another user")
	}
	for _, tt := range []struct {
		name    string
		uid     int
		mode    os.FileMode
		link    bool // the runtime dir is a symlink owned by uid to a root-owned directory of mode
		refused string
	}{
		{"owned by another user", 4242, 0o777, false, "owned by uid 4242"},
		{"writable by everyone", 0, 0o777, false, "writable by everyone"},
		{"sticky, like /tmp", 0, 0o777 | os.ModeSticky, false, ""},
		// The link's owner chose where the socket goes, even to a
		// directory that passes.
		{"symlink of another user", 4242, 0o777 | os.ModeSticky, true, "symlink owned by uid 4242"},
		{"symlink of root", 0, 0o777 | os.ModeSticky, true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			dir, dirUID := cfg.RuntimeDir, tt.uid
			if tt.link {
				dir, dirUID = filepath.Join(t.TempDir(), "shared"), 0
			}
			if err := os.Mkdir(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, dirUID, dirUID); err != nil {
				t.Fatal(err)
			}
			if tt.link {
				if err := os.Symlink(dir, cfg.RuntimeDir); err != nil {
					t.Fatal(err)
				}
				if err := os.Lchown(cfg.RuntimeDir, tt.uid, tt.uid); err != nil {
					t.Fatal(err)
				}
			}
			d, err := New(cfg, slog.New(slog.DiscardHandler))
			if tt.refused == "" {
				if err != nil {
					t.Fatalf("New = %v", err)
				}
				d.closeResources()
				return
			}
			if err == nil {
				d.closeResources()
				t.Fatalf("New served in a runtime dir %s", tt.name)
			}
			if !strings.Contains(err.Error(), tt.refused) {
				t.Errorf("New = %v, want a refusal saying %q", err, tt.refused)
			}
			if _, err := os.Lstat(filepath.Join(dir, filepath.Base(cfg.Socket))); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket created anyway: %v", err)
			}
		})
	}
}

// TestReload applies a new configuration to a running daemon with a
// session open: the level and watermarks change live, the fields that need
// a restart are named in one warning, and the session keeps working.
func TestReload(t *testing.T) {
	cfg := testConfig(t)
	logs := &syncBuffer{}
	cfg.Log.Format = "json"
	log := cfg.Log.NewLogger(logs)
	r := startDaemon(t, cfg, log)
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: cfg.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, testNamespace(64*KiB))
	if err != nil {
		t.Fatal(err)
	}
	putBlocks(t, s, 4)

	log.Debug("before reload") // filtered at info
	next := cfg
	next.Log.Level = "debug"
	next.Host.HighWatermark, next.Host.LowWatermark = 0.7, 0.5
	next.Host.Capacity = 16 * MiB                             // the arena is sealed
	next.Socket = filepath.Join(cfg.RuntimeDir, "other.sock") // clients are bound to it
	next.Auth.GIDs = []uint32{}                               // same as nil: not a change
	if err := r.d.Reload(next); err != nil {
		t.Fatal(err)
	}
	log.Debug("after reload")

	if h, l := r.d.chain.Watermarks(); h != 0.7 || l != 0.5 {
		t.Errorf("watermarks = %v/%v, want 0.7/0.5", h, l)
	}
	got := r.d.Config()
	if got.Log.Level != "debug" || got.Host.HighWatermark != 0.7 || got.Host.Capacity != cfg.Host.Capacity || got.Socket != cfg.Socket {
		t.Errorf("config in effect = %+v", got)
	}
	// The session survived: its blocks and ops still work.
	dst := make([]byte, s.BlockBytes())
	if err := s.Get(ctx, testHash(3), dst); err != nil || dst[0] != 4 {
		t.Fatalf("get after reload: %v (first byte %d)", err, dst[0])
	}

	// An invalid configuration is refused as a whole.
	bad := next
	bad.Host.LowWatermark = 0.9 // above high
	bad.Log.Level = "info"
	if err := r.d.Reload(bad); err == nil {
		t.Error("Reload accepted low_watermark > high_watermark")
	}
	if r.d.Config().Log.Level != "debug" {
		t.Error("a refused reload changed the log level")
	}

	r.stop(t)
	var sawRestart, sawReloaded, sawBefore, sawAfter bool
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q: %v", line, err)
		}
		if m["time"] == nil || m["level"] == nil || m["msg"] == nil {
			t.Errorf("log line lacks time/level/msg: %q", line)
		}
		switch m["msg"] {
		case "configuration changes need a restart; ignored until then":
			sawRestart = true
			if m["level"] != "WARN" || m["fields"] != "socket,host.capacity" {
				t.Errorf("restart warning = %v", m)
			}
		case "configuration reloaded":
			sawReloaded = true
			if m["applied"] != "log.level,host.high_watermark,host.low_watermark" {
				t.Errorf("reloaded = %v", m)
			}
		case "before reload":
			sawBefore = true
		case "after reload":
			sawAfter = true
		}
	}
	if !sawRestart || !sawReloaded || sawBefore || !sawAfter {
		t.Errorf("logs: restart warning %v, reloaded %v, debug before reload %v (want false), debug after %v",
			sawRestart, sawReloaded, sawBefore, sawAfter)
	}
}

// TestReloadFromArgs reads the file again with the same flags; an unset
// host.capacity keeps the running arena's size instead of being sized from
// memory again.
func TestReloadFromArgs(t *testing.T) {
	dir := t.TempDir()
	path := writeTOML(t, `
[host]
slab_bytes = "1MiB"
high_watermark = 0.8
low_watermark = 0.6
[nvme]
enabled = false
`)
	args := []string{"-config", path, "-runtime-dir", filepath.Join(dir, "run"), "-state-dir", filepath.Join(dir, "state"), "-log-level", "warn"}
	running := Config{Host: HostConfig{Capacity: 6 * MiB}}
	c, err := ReloadFromArgs(args, running)
	if err != nil {
		t.Fatal(err)
	}
	if c.Host.Capacity != 6*MiB || c.Host.HighWatermark != 0.8 || c.Log.Level != "warn" || c.NVMe.Enabled {
		t.Errorf("reloaded config = %+v", c)
	}
	if _, err := ReloadFromArgs(append(args, "-host-capacity", "4MiB"), running); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, []byte("[host]\nbogus = 1\n"), 0o600)
	if _, err := ReloadFromArgs(args, running); err == nil || !strings.Contains(err.Error(), "unknown key") {
		t.Errorf("reload of a bad file = %v, want unknown key", err)
	}
}

// TestLoggerLevelVar: NewLogger's level follows its LevelVar, and derived
// loggers share it.
func TestLoggerLevelVar(t *testing.T) {
	var buf bytes.Buffer
	log := LogConfig{Level: "warn", Format: "json"}.NewLogger(&buf)
	child := log.With("k", "v")
	child.Info("hidden")
	lv := levelVarOf(log)
	if lv == nil {
		t.Fatal("no LevelVar on a NewLogger logger")
	}
	lv.Set(slog.LevelInfo)
	child.Info("shown")
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	if m["msg"] != "shown" || m["k"] != "v" || m["level"] != "INFO" {
		t.Errorf("got %v", m)
	}
	if levelVarOf(slog.New(slog.DiscardHandler)) != nil {
		t.Error("LevelVar found on a foreign logger")
	}
}

// TestLoopsCounted: the daemon counts its ring loops (crowded, which lets
// spinning loops skip runtime.Gosched, reads it), and a closed session's
// loop leaves the count.
func TestLoopsCounted(t *testing.T) {
	cfg := testConfig(t)
	r := startDaemon(t, cfg, nil)
	ctx := context.Background()
	c := dialDaemon(t, cfg)
	waitLoops := func(want int32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for r.d.loops.Load() != want {
			if time.Now().After(deadline) {
				t.Fatalf("ring loops %d, want %d", r.d.loops.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	var ss []*client.Session
	for i := range runtime.GOMAXPROCS(0) {
		s, err := c.Open(ctx, testNamespace(4096))
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
		waitLoops(int32(i + 1))
		if got, want := r.d.crowded(), i+1 >= runtime.GOMAXPROCS(0); got != want {
			t.Fatalf("%d loops, GOMAXPROCS %d: crowded %v", i+1, runtime.GOMAXPROCS(0), got)
		}
	}
	for _, s := range ss {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	waitLoops(0)
	if r.d.crowded() {
		t.Fatal("crowded with no ring loop")
	}
}

// TestSpinLimit: every loop may spin while there are no more loops than
// CPUs, or when its session is hot; beyond that, half the CPUs.
func TestSpinLimit(t *testing.T) {
	for _, tc := range []struct {
		loops int32
		hot   bool
		want  int32
	}{
		{0, false, 8}, {1, false, 8}, {8, false, 8}, {9, false, 4}, {100, false, 4},
		{9, true, 8}, {100, true, 8},
	} {
		d := &Daemon{maxSpinners: 4, maxHot: 8}
		d.loops.Store(tc.loops)
		if got := d.spinLimit(tc.hot); got != tc.want {
			t.Errorf("%d loops, hot %v: limit %d, want %d", tc.loops, tc.hot, got, tc.want)
		}
	}
}

// TestClientExitedOnce: the exit probe may report one death twice (threads of
// a killed group exit concurrently); the second report stops and counts
// nothing.
func TestClientExitedOnce(t *testing.T) {
	cfg := testConfig(t)
	r := startDaemon(t, cfg, nil)
	ctx := context.Background()
	c := dialDaemon(t, cfg)
	for range 2 {
		if _, err := c.Open(ctx, testNamespace(4096)); err != nil {
			t.Fatal(err)
		}
	}
	// Open returns on the Welcome, which the daemon sends just before it
	// registers the session: wait until both are registered.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.d.mu.Lock()
		n := len(r.d.sessions)
		r.d.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions registered, want 2", n)
		}
		time.Sleep(time.Millisecond)
	}
	before := r.d.probes.exits.Load()
	pid := uint32(os.Getpid())
	if n := r.d.clientExited(pid+1<<20, 0); n != 0 {
		t.Fatalf("another pid's death stopped %d sessions", n)
	}
	if n := r.d.clientExited(pid, 0); n != 2 {
		t.Fatalf("first report stopped %d sessions, want 2", n)
	}
	if n := r.d.clientExited(pid, 0); n != 0 {
		t.Fatalf("second report of the same death stopped %d sessions, want 0", n)
	}
	if got := r.d.probes.exits.Load() - before; got != 2 {
		t.Fatalf("client_exit_sessions_total grew by %d, want 2", got)
	}
}

// TestSlowSetupKeepsHandshake: the handshake deadline is the peer's. A
// session whose setup is slow on the daemon's side (its namespace is new
// and persisting it waits, as an fsync on a busy disk can, for longer than
// the deadline) still opens and works: before, the welcome went out after
// the deadline and the client read EOF.
func TestSlowSetupKeepsHandshake(t *testing.T) {
	cfg := testConfig(t)
	r := startDaemon(t, cfg, nil)
	c := dialDaemon(t, cfg)
	r.d.reg.wmu.Lock() // Register waits here
	held := make(chan struct{})
	go func() {
		defer close(held)
		time.Sleep(handshakeTimeout + 500*time.Millisecond)
		r.d.reg.wmu.Unlock()
	}()
	t0 := time.Now()
	s, err := c.Open(context.Background(), testNamespace(4096))
	<-held
	if err != nil {
		t.Fatalf("Open with a setup slower than the handshake deadline: %v", err)
	}
	if waited := time.Since(t0); waited < handshakeTimeout {
		t.Fatalf("Open returned after %v: the setup was not slowed", waited)
	}
	putBlocks(t, s, 1)
	dst := make([]byte, s.BlockBytes())
	if err := s.Get(context.Background(), testHash(0), dst); err != nil || !bytes.Equal(dst, bytes.Repeat([]byte{1}, s.BlockBytes())) {
		t.Fatalf("get after the slow open: %v", err)
	}
}
