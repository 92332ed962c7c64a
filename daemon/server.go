package daemon

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// Version is the daemon's version string, reported in status.
var Version = "0.1.0-dev"

// handshakeTimeout bounds how long an unauthenticated peer may hold a
// connection before sending its Hello, and each write of the handshake
// (a peer that never reads). It does not cover the daemon's own work in
// between: a first namespace is persisted with fsync, which a disk busy
// with demotions can hold for seconds.
const handshakeTimeout = 2 * time.Second

// adminIdle bounds the wait for an admin connection's next request: the
// client library opens one per call, and one left open by a process that
// forgot it must not keep its place under session.max_admin for good.
const adminIdle = time.Minute

// adminReplyTimeout bounds each reply's write on an admin connection: a
// peer that sends requests and never reads its replies fills its receive
// queue, and our write would block for good, holding the connection's
// goroutine and one of session.max_admin's places (enough such peers lock
// kvtierctl out). A reader takes microseconds; a few seconds covers a
// loaded host.
const adminReplyTimeout = 5 * time.Second

// refuseLinger bounds how long a refused peer has to read the refusal and
// hang up before the daemon closes the connection anyway.
const refuseLinger = 500 * time.Millisecond

// maxPreHello bounds the connections accepted and not yet past their hello
// (or their refusal). Each holds an fd, a goroutine and a hello buffer for
// up to handshakeTimeout (plus refuseLinger): a process connecting in a loop
// (about 14,000 a second measured here) could hold some 28,000 at once
// (14,000 × handshakeTimeout), enough to take
// the daemon's fds from its sessions, NVMe segments and metrics listener.
// Real clients say hello at once: hundreds in their handshake at a time is
// a flood.
const maxPreHello = 256

// refuseNowWait is how long a connection refused past maxPreHello is held
// for its hello: short, so a flood's refusals hold few fds at a time.
const refuseNowWait = 50 * time.Millisecond

// Daemon is a running kvtierd instance.
type Daemon struct {
	cfg Config
	log *slog.Logger
	// peerLog is log for the lines peers cause, rate-limited per message
	// (logging.go); sessions and connections log through loggers derived
	// from it.
	peerLog *slog.Logger
	start   time.Time

	lock  *os.File
	arena *shm.Region
	host  *tiers.Host
	nvme  *nvme.Store // nil when the NVMe tier is off
	chain *tiers.Chain
	gpus  *tiers.GPUSet // nil when the GPU tier is off (gpu.go)
	// sleepBound caps a ring loop's futex sleep (the const sleepBound;
	// tests raise it before Run).
	sleepBound time.Duration
	// deferredWait: how long a closing session waits for its promotions
	// (the const deferredWait; tests shorten it before Run).
	deferredWait time.Duration
	// now is the stop budget's clock (time.Now; tests move it on), and
	// testAfterDrain, when set, runs once the sessions have ended, and
	// testChainStopped once the tier chain's goroutines are told to stop.
	now              func() time.Time
	testAfterDrain   func()
	testChainStopped func()
	reg              *Registry
	ln               *net.UnixListener

	mu       sync.Mutex
	sessions map[uint64]*session
	opening  int // sessions past the limit check, not yet in sessions
	// admins: admin connections welcomed and not yet ended or displaced,
	// at most session.max_admin (takeAdmin).
	admins   map[*adminConn]struct{}
	adminSeq uint64
	// adminIdle: how long an admin connection may wait between requests
	// (the const adminIdle; tests shorten it before Run).
	adminIdle time.Duration
	// preHello counts connections not yet past their hello, up to
	// maxPreHello (a field: tests lower it before Run).
	preHello    atomic.Int32
	maxPreHello int32
	// adminReply: how long a reply on an admin connection may wait for
	// its peer to read (the const adminReplyTimeout; tests shorten it).
	adminReply time.Duration
	nextID     uint64
	wg         sync.WaitGroup
	closing    atomic.Bool

	loops       atomic.Int32 // ring loops running (one per session)
	spinners    atomic.Int32 // ring loops currently spinning
	maxSpinners int32
	maxHot      int32 // spinning loops allowed when all of them are hot (shm.Pacer.Hot)
	procs       procSizer

	sessionsTotal atomic.Uint64
	// roomWaits counts ring loop waits for room in a full completion
	// ring (a test's measure of how often stuck clients wake the loops).
	roomWaits   atomic.Uint64
	sessionsBad atomic.Uint64
	ops         [16]atomic.Uint64

	metrics *metrics // nil when metrics.listen is ""; see metrics.go

	reload reloadState // see reload.go
	warm   warmState   // see warm.go

	probes *probes // eBPF probes, memory pressure controller; see ebpf.go

	// quar holds the open reservations of ended sessions until
	// their process has exited (quarantine.go).
	quar *quarantine

	// notifyMu orders a reload's RELOADING=1 / READY=1 against STOPPING=1,
	// after which stopping is set and no READY=1 follows (notify.go).
	notifyMu sync.Mutex
	stopping bool
}

// New prepares a daemon: directories, state lock, namespace registry, host
// arena and listening socket. Nothing is served until Run.
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	return NewContext(context.Background(), cfg, log)
}

// NewContext is New, given up when ctx ends: a stop asked for during
// start-up (SIGTERM while a large NVMe tier reindexes, which may take
// minutes) ends it with an error wrapping ctx's, having bound no socket,
// rather than after a whole start-up followed by READY=1 and a drain.
func NewContext(ctx context.Context, cfg Config, log *slog.Logger) (*Daemon, error) {
	if log == nil {
		log = slog.Default()
	}
	d := &Daemon{cfg: cfg, log: log, start: time.Now(), sessions: map[uint64]*session{}, sleepBound: sleepBound, deferredWait: deferredWait, now: time.Now, adminIdle: adminIdle, adminReply: adminReplyTimeout, maxPreHello: maxPreHello,
		maxSpinners: int32(max(1, runtime.NumCPU()/2)), maxHot: int32(runtime.NumCPU())}
	d.peerLog = rateLimited(log, newLogLimiter())
	d.procs.init()
	d.quar = newQuarantine(d.peerLog) // a line per session that ends holding reservations
	if cfg.Metrics.Listen != "" {
		d.metrics = newMetrics(d)
	}
	ok := false
	defer func() {
		if !ok {
			d.closeResources()
		}
	}()
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return nil, fmt.Errorf("create state dir %s: %w", cfg.StateDir, err)
	}
	lock, err := lockFile(filepath.Join(cfg.StateDir, "kvtierd.lock"))
	if err != nil {
		return nil, err
	}
	d.lock = lock
	if d.reg, err = OpenRegistry(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("open namespace registry: %w", err)
	}
	stopped := func() error {
		if ctx.Err() != nil {
			return fmt.Errorf("start-up stopped: %w", context.Cause(ctx))
		}
		return nil
	}
	if err := stopped(); err != nil {
		return nil, err
	}
	t0 := time.Now()
	// The arena a previous kvtierd left in systemd's fd store, or a new one.
	if d.arena, err = d.openArena(); err != nil {
		return nil, fmt.Errorf("create host arena: %w", err)
	}
	if cfg.Host.HugePages && !d.arena.Huge {
		log.Warn("hugepages requested but transparent huge pages are off for shared memory (/sys/kernel/mm/transparent_hugepage/shmem_enabled); host arena uses normal pages")
	}
	d.host, err = tiers.NewHost(d.arena.Bytes(), tiers.HostConfig{SlabBytes: int64(cfg.Host.SlabBytes), Align: hostAlign})
	if err != nil {
		return nil, fmt.Errorf("host tier: %w", err)
	}
	if err := stopped(); err != nil {
		return nil, err
	}
	if cfg.NVMe.Enabled {
		if d.nvme, err = openNVMe(ctx, cfg, d.reg.Epoch(), d.reg.NewEpoch(), log); err != nil {
			if serr := stopped(); serr != nil {
				return nil, serr // the reindex was cut, not the tier broken
			}
			// The host tier works alone; say so loudly rather than refuse
			// to serve.
			log.Error("nvme tier unavailable; running with the host tier only", "err", err)
		}
	} else {
		log.Info("nvme tier disabled by configuration")
	}
	if d.nvme != nil && d.nvme.MaxBlockBytes() < int64(cfg.Host.SlabBytes) {
		// Segments are sized from the capacity; a block larger than one
		// has no tier below the host (kvtier_nvme_oversize_drops_total).
		log.Warn("nvme.capacity is too small for blocks up to host.slab_bytes: larger blocks are dropped from the host tier instead of demoted",
			"nvme_max_block", ByteSize(d.nvme.MaxBlockBytes()).String(), "slab_bytes", cfg.Host.SlabBytes.String())
	}
	d.chain, err = tiers.NewChain(d.host, d.nvme, d.chainConfig())
	if err != nil {
		return nil, fmt.Errorf("tier chain: %w", err)
	}
	d.adoptWarm() // blocks left in a stored arena, verified
	if err := stopped(); err != nil {
		return nil, err
	}
	d.gpus = openGPUs(cfg, d.chain, d.arena.Bytes(), log)
	// After the warm adoption, which looks ids up: nothing is reclaimed
	// before the first session's Register.
	d.reg.setReclaim(d.dropInUse, func(ids []uint32) {
		if n := d.deleteNamespaces(ids); n > 0 {
			log.Warn("blocks of reclaimed namespaces deleted (they reached a tier after the idle check)", "blocks", n, "namespaces", len(ids))
		}
	}, log)
	log.Info("replacement policy", "name", d.chain.PolicyName())
	log.Info("host tier ready", "capacity", cfg.Host.Capacity.String(), "slab", cfg.Host.SlabBytes.String(),
		"hugepages", d.arena.Huge, "took", time.Since(t0).Round(time.Millisecond))
	if err := stopped(); err != nil {
		return nil, err
	}
	if d.ln, err = listen(cfg.RuntimeDir, cfg.Socket); err != nil {
		return nil, err
	}
	log.Info("kvtierd listening", "socket", cfg.Socket, "state_dir", cfg.StateDir, "runtime_dir", cfg.RuntimeDir,
		"allowed_uids", cfg.Auth.UIDs, "allowed_gids", cfg.Auth.GIDs, "pid", os.Getpid(), "version", Version)
	d.openProbes() // logs each one unavailable; never fatal (ebpf.go)
	d.listenMetrics()
	if err := stopped(); err != nil {
		return nil, err
	}
	ok = true
	return d, nil
}

// chainConfig is the tier chain's configuration from the daemon's.
func (d *Daemon) chainConfig() tiers.ChainConfig {
	return tiers.ChainConfig{
		HighWatermark: d.cfg.Host.HighWatermark, LowWatermark: d.cfg.Host.LowWatermark, Logger: d.log,
		ParkTTL:       time.Duration(d.cfg.NVMe.ParkTTLSeconds) * time.Second,
		ParkedShare:   d.cfg.NVMe.ParkedShare,
		ParkStatePath: filepath.Join(d.cfg.StateDir, parkStateFile),
		Policy:        d.cfg.Host.Policy,
		ObserveSwapIn: d.metrics.swapInHook(), ObserveSwapOut: d.metrics.swapOutHook(),
	}
}

// openNVMe opens the NVMe tier in <state>/nvme, sized from the disk when
// the configuration leaves it at 0. Its blocks are keyed by namespace id,
// which only means something within the registry epoch it was written
// under (see bindNVMeEpoch).
func openNVMe(ctx context.Context, cfg Config, epoch uint64, newEpoch bool, log *slog.Logger) (*nvme.Store, error) {
	dir := filepath.Join(cfg.StateDir, "nvme")
	if err := bindNVMeEpoch(cfg.StateDir, dir, epoch, newEpoch, log); err != nil {
		return nil, err
	}
	capacity := int64(cfg.NVMe.Capacity)
	if capacity == 0 {
		// What the tier already holds is room it has: counted as taken,
		// every restart of a filled cache would shrink its budget and
		// evict what it had kept. Its directory, once it exists, is where
		// both are measured (it may be a mount of its own).
		on := cfg.StateDir
		if _, err := os.Stat(dir); err == nil {
			on = dir
		}
		var st unix.Statfs_t
		if err := unix.Statfs(on, &st); err != nil {
			return nil, fmt.Errorf("size nvme tier: statfs %s: %w", on, err)
		}
		free := int64(st.Bavail)*int64(st.Bsize) + nvme.DiskUsage(dir)
		capacity = min(free/2, 1<<40)
		if capacity < nvme.MinCapacity {
			return nil, fmt.Errorf("only %d bytes free under %s; set nvme.capacity or nvme.enabled=false", free, cfg.StateDir)
		}
	}
	t0 := time.Now()
	store, err := nvme.Open(ctx, nvme.Options{
		Dir: dir, CapacityBytes: capacity, Logger: log,
		// Parked requests are never dropped for space; they expire by TTL.
		Unevictable: func(k nvme.Key) bool { return k.NS&tiers.ParkedNS != 0 },
	})
	if err != nil {
		return nil, err
	}
	st := store.Stats()
	log.Info("nvme tier ready", "dir", dir, "capacity", ByteSize(capacity).String(), "blocks", st.Blocks,
		"bytes", st.Bytes, "reindexed_in", time.Since(t0).Round(time.Millisecond))
	return store, nil
}

// parkStateFile, in the state dir, holds the parked requests' expiries
// from the last stop to the next start (tiers.ChainConfig.ParkStatePath).
const parkStateFile = "parked.expiry"

// nvmeEpochFile, in the state dir, holds the namespace registry epoch the
// NVMe tier's blocks were written under.
const nvmeEpochFile = "nvme.epoch"

// bindNVMeEpoch empties the NVMe directory dir unless it was written under
// the registry epoch epoch, then records epoch. After the registry had to
// be discarded, ids are handed out again from 1: blocks a previous daemon
// stored under an id would be served to whichever model gets it next (the
// token hashes do not depend on the model). A store without an epoch file
// (written by a kvtierd from before the file existed) is kept when the
// registry was loaded rather than started anew (newEpoch false): it was
// written under that registry, and an upgrade keeps its cache warm. The
// directory is emptied before the new epoch is recorded, so a crash in
// between only drops it again at the next start.
func bindNVMeEpoch(stateDir, dir string, epoch uint64, newEpoch bool, log *slog.Logger) error {
	path := filepath.Join(stateDir, nvmeEpochFile)
	want := fmt.Sprintf("%016x\n", epoch)
	got, err := os.ReadFile(path)
	switch {
	case err == nil && string(got) == want:
		return nil
	case errors.Is(err, os.ErrNotExist) && !newEpoch:
		if err := writeFileAtomic(path, []byte(want), 0o640); err != nil {
			return fmt.Errorf("nvme tier: record registry epoch: %w", err)
		}
		return nil
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("nvme tier: read %s: %w", path, err)
	}
	// Its contents, not the directory: it may be a mount point (whose
	// lost+found stays).
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("nvme tier: %w", err)
	}
	ents = slices.DeleteFunc(ents, func(e fs.DirEntry) bool { return e.Name() == "lost+found" })
	if len(ents) > 0 {
		log.Warn("nvme tier was written under another namespace registry epoch (or an unknown one); starting it empty",
			"dir", dir, "stored_epoch", strings.TrimSpace(string(got)), "registry_epoch", fmt.Sprintf("%016x", epoch))
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("nvme tier: empty %s: %w", dir, err)
		}
	}
	if err := writeFileAtomic(path, []byte(want), 0o640); err != nil {
		return fmt.Errorf("nvme tier: record registry epoch: %w", err)
	}
	return nil
}

// lockFile takes an exclusive lock so that two daemons never share a state
// dir.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another kvtierd holds the state dir %s (lock %s)", filepath.Dir(path), path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// listen binds the SOCK_SEQPACKET control socket, refusing to steal a socket
// another live daemon serves and removing a stale one.
func listen(runtimeDir, path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(runtimeDir, 0o750); err != nil {
		return nil, fmt.Errorf("create runtime dir %s: %w", runtimeDir, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create socket dir %s: %w", filepath.Dir(path), err)
	}
	if err := shm.CheckSocketDir(filepath.Dir(path), os.Geteuid()); err != nil {
		if errors.Is(err, shm.ErrSocketDirUnsafe) {
			return nil, fmt.Errorf("%w: its owner could replace the socket; use a directory of your own (runtime_dir, socket, or $XDG_RUNTIME_DIR)", err)
		}
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		// Only a socket can be stale: anything else there is a mistyped
		// path, and removing it would destroy what it names.
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("socket path %s exists and is not a socket (%s); refusing to replace it", path, fi.Mode().Type())
		}
		// Only a refused connection says nobody listens: a socket of
		// another type (EPROTOTYPE) is some other program's, live, and a
		// full backlog (EAGAIN) a busy daemon's.
		c, derr := net.DialTimeout("unixpacket", path, time.Second)
		switch {
		case derr == nil:
			c.Close()
			return nil, fmt.Errorf("another kvtierd is serving %s", path)
		case errors.Is(derr, unix.EPROTOTYPE):
			return nil, fmt.Errorf("socket path %s is in use by a socket of another type (not a kvtierd's); refusing to replace it", path)
		case !errors.Is(derr, unix.ECONNREFUSED):
			return nil, fmt.Errorf("socket path %s may be in use (connecting to it failed: %v); refusing to replace it", path, derr)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Access is decided by SO_PEERCRED; the mode keeps others from even
	// connecting.
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	return ln, nil
}

// Run serves until ctx is cancelled, then closes every session and returns.
func (d *Daemon) Run(ctx context.Context) error {
	// A failed accept stops the daemon as ctx does: it ends what waits
	// on ctx (admin peers, pending handshakes, the pressure controller)
	// and tells systemd STOPPING=1, whose watchdog would otherwise go on
	// seeing a daemon that accepts no one.
	ctx, fail := context.WithCancel(ctx)
	defer fail()
	// systemd: READY=1 now, STATUS/WATCHDOG while serving and draining,
	// STOPPING=1 when ctx ends; stopped last (see notify.go).
	defer d.startNotify(ctx)()
	d.storeArena() // systemd's fd store keeps it across a restart (warm.go)
	defer d.closeResources()
	defer d.serveMetrics()() // stopped before the tiers close
	stop := context.AfterFunc(ctx, func() {
		d.closing.Store(true)
		d.ln.Close()
	})
	defer stop()
	// The movers outlive the sessions: they run until they are gone and the
	// GPU and host tiers have been written down.
	chainCtx, stopChain := context.WithCancel(context.Background())
	defer stopChain()
	d.chain.Start(chainCtx)
	if d.gpus != nil {
		d.gpus.Start(chainCtx)
	}
	defer d.runProbes(ctx)() // exit events, pressure controller (ebpf.go)
	go d.quar.run(chainCtx)  // owned by Run: ends at quar.close below, or with chainCtx
	if d.cfg.Host.Prefault {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.prefault(ctx)
		}()
	}
	var err error
	var backoff time.Duration
	var short fdShortage
	var spare spareFD
	spare.open()
	defer spare.close()
	for {
		c, aerr := d.ln.AcceptUnix()
		if aerr != nil {
			if d.closing.Load() {
				break
			}
			if acceptRetryable(aerr) {
				// Out of fds or memory for now (a burst of peers): the
				// connection waits in the backlog until some are freed.
				// When the shortage lasts (sessions hold the fds), the
				// oldest peer waiting is told so, on the spare fd, rather
				// than left to its handshake timeout.
				lasted := short.fail(time.Now())
				if outOfFDs(aerr) && lasted && spare.release() {
					if c, rerr := d.ln.AcceptUnix(); rerr == nil {
						d.wg.Add(1)
						go func() {
							defer d.wg.Done()
							d.answerOnSpare(ctx, c, &spare, aerr)
						}()
						continue
					}
					spare.open()
				}
				backoff = min(max(2*backoff, 5*time.Millisecond), maxAcceptBackoff)
				d.log.Warn("accept failed; retrying", "err", aerr, "in", backoff)
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
				}
				continue
			}
			err = fmt.Errorf("accept: %w", aerr)
			d.log.Error("accept failed; shutting down", "err", aerr)
			fail()
			break
		}
		backoff = 0
		short.end()
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.serveConn(ctx, c)
		}()
	}
	d.closing.Store(true)
	stopAt := d.now()
	// A Reload in flight (it uses d.nvme and the chain) ends before the
	// tiers close; later ones see closing and are refused.
	d.reload.mu.Lock()
	d.reload.mu.Unlock()
	d.mu.Lock()
	for _, s := range d.sessions {
		s.stop()
	}
	d.mu.Unlock()
	d.wg.Wait()
	// The sessions are done, so nothing adds to the quarantine any more.
	// Its reservations are released before the tiers are written down and
	// closed: a late copy must land before the host arena is kept for a
	// warm restart, whose next daemon may hand the slot out. An arena not
	// kept is handed out by no one after the flush below (whose demotions
	// of GPU blocks reserve host slots: those still held are not among
	// them): its reservations are released after it, not waited for.
	if d.warm.kept {
		d.quar.close(true)
	}
	if d.testAfterDrain != nil {
		d.testAfterDrain()
	}
	budget := time.Duration(d.cfg.NVMe.StopBudgetSeconds) * time.Second
	left := budget - d.now().Sub(stopAt)
	if d.cfg.NVMe.FlushOnStop && d.nvme != nil && left <= 0 {
		// The drain (promotions, quarantined copies) took the whole
		// budget: writing down now would run into systemd's SIGKILL.
		d.log.Warn("stop budget spent before the write-down; the host tier is not written down to nvme",
			"stop_budget", budget, "spent", d.now().Sub(stopAt).Round(time.Millisecond))
	}
	if d.cfg.NVMe.FlushOnStop && d.nvme != nil && left > 0 {
		// One bound for both steps, the rest of the stop's budget. The
		// GPU-only blocks first, into the host tier (which makes room by
		// demoting to NVMe), while the movers still run; then the host
		// tier, those blocks with it.
		fctx, cancel := context.WithTimeout(context.Background(), left)
		if d.gpus != nil {
			t0 := time.Now()
			n, ferr := d.gpus.Flush(fctx)
			d.log.Info("gpu tier written down to the host tier", "blocks", n, "took", time.Since(t0).Round(time.Millisecond), "err", ferr)
		}
		t0 := time.Now()
		n, ferr := d.chain.Flush(fctx)
		cancel()
		d.log.Info("host tier written down to nvme", "blocks", n, "took", time.Since(t0).Round(time.Millisecond), "err", ferr)
	}
	d.quar.close(false) // a no-op after close(true) above
	stopChain()
	if d.testChainStopped != nil {
		d.testChainStopped()
	}
	if d.gpus != nil {
		d.gpus.Wait()
	}
	d.chain.Wait()
	// Parked requests survive a stop whatever flush_on_stop says: those
	// still queued for their write-through (or held for a retry) when the
	// chain stopped are in the host tier only (after a full write-down,
	// none are left to write). They get at least parkedStopGrace (within
	// the budget) even when the drain or the write-down spent the budget:
	// they are promised to be kept, the rest of the host tier is not.
	if d.nvme != nil {
		left := max(budget-d.now().Sub(stopAt), min(parkedStopGrace, budget))
		fctx, cancel := context.WithTimeout(context.Background(), left)
		t0 := time.Now()
		n, ferr := d.chain.FlushParked(fctx)
		cancel()
		if n > 0 || ferr != nil {
			d.log.Info("parked blocks written down to nvme", "blocks", n, "took", time.Since(t0).Round(time.Millisecond), "err", ferr)
		}
	}
	d.storeSnapshot() // the host tier's index, for a warm restart (warm.go)
	d.log.Info("kvtierd stopped")
	return err
}

// acceptRetryable reports whether an accept error is a shortage that
// passes (descriptors, memory) rather than a broken listener.
func acceptRetryable(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) ||
		errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM)
}

// acceptShortage is how long accept may fail for want of fds before the
// peers waiting in the backlog are refused (one at a time, on the spare fd)
// rather than left to wait for fds without a word.
const acceptShortage = time.Second

// maxAcceptBackoff bounds the wait between failed accepts: while a shortage
// lasts, accept fails at least this often (Linux takes the fd before it
// looks at the backlog, so it fails even with no peer waiting).
const maxAcceptBackoff = time.Second

// fdShortage is a run of accepts failing for want of resources.
type fdShortage struct{ start, last time.Time }

// fail records a failed accept at now and reports whether the shortage has
// lasted acceptShortage. A failure more than two maxAcceptBackoff after the
// previous one starts a new shortage: the loop did not fail in between, so
// the fds came back (it was waiting on the spare fd's accept, or accepting).
func (s *fdShortage) fail(now time.Time) bool {
	if s.start.IsZero() || now.Sub(s.last) > 2*maxAcceptBackoff {
		s.start = now
	}
	s.last = now
	return now.Sub(s.start) >= acceptShortage
}

// end records a successful accept.
func (s *fdShortage) end() { *s = fdShortage{} }

// answerOnSpare answers a peer accepted on the fd the spare freed. With no
// peer waiting, that accept waited for the next one for as long as it took:
// the shortage may be over by now, and a spare taken again says it is; then
// the peer is served. Otherwise it is refused busy, after its credentials
// (a peer that is not allowed learns nothing of the daemon's state), and
// the spare is taken again once its fd is closed.
func (d *Daemon) answerOnSpare(ctx context.Context, c *net.UnixConn, spare *spareFD, aerr error) {
	if spare.open(); spare.held() {
		d.serveConn(ctx, c)
		return
	}
	defer spare.open()
	defer c.Close()
	if !d.authorized(c) {
		return
	}
	d.peerLog.Warn("refusing a connection: out of file descriptors", "err", aerr, "fd_limit", fdLimit())
	d.refuse(c, shm.CodeBusy, fmt.Sprintf("kvtierd is out of file descriptors (its limit is %d); try again later", fdLimit()))
}

// outOfFDs reports whether err is a shortage of file descriptors.
func outOfFDs(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)
}

// fdLimit is the daemon's soft RLIMIT_NOFILE (0 if unknown), for messages.
func fdLimit() uint64 {
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) != nil {
		return 0
	}
	return r.Cur
}

// spareFD is an fd held in reserve (of /dev/null) so that a connection can
// be accepted, and refused with a reason, when the process is out of fds.
// The accept loop releases it; the refusal's goroutine opens it again.
type spareFD struct{ fd atomic.Int64 } // the fd + 1; 0: none held

// open takes a spare fd if none is held (none when the process is out).
func (s *spareFD) open() {
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	if !s.fd.CompareAndSwap(0, int64(fd)+1) {
		unix.Close(fd)
	}
}

// held reports whether a spare fd is held.
func (s *spareFD) held() bool { return s.fd.Load() != 0 }

// release closes the spare fd, reporting whether one was held; if none
// was, it tries to take one for the next time.
func (s *spareFD) release() bool {
	v := s.fd.Swap(0)
	if v == 0 {
		s.open()
		return false
	}
	unix.Close(int(v - 1))
	return true
}

func (s *spareFD) close() {
	if v := s.fd.Swap(0); v != 0 {
		unix.Close(int(v - 1))
	}
}

// flushTimeout bounds a write-down asked for by kvtierctl flush. The one
// at shutdown has what is left of nvme.stop_budget_s instead.
const flushTimeout = 60 * time.Second

// parkedStopGrace is the least time a stop gives the parked blocks still
// queued for their write-down, past nvme.stop_budget_s if the drain or the
// host tier's write-down spent it (capped by the budget itself): the
// default budget leaves the unit's TimeoutStopSec 15 s, of which this takes
// a third at most, and a few seconds write thousands of blocks.
const parkedStopGrace = 5 * time.Second

// maxStopBudget caps nvme.stop_budget_s: a stop of an hour is already
// one that systemd's TimeoutStopSec must be raised for on purpose.
const maxStopBudget = 3600

// prefault populates the host arena slab by slab in the background, so the
// daemon serves at once while the first copies into each slot stop paying
// for page allocation (which costs more than the copy itself).
func (d *Daemon) prefault(ctx context.Context) {
	t0 := time.Now()
	size, step := d.arena.Size(), int64(d.cfg.Host.SlabBytes)
	for off := int64(0); off < size; off += step {
		if ctx.Err() != nil {
			return
		}
		if err := d.arena.PopulateRange(off, min(step, size-off)); err != nil {
			d.log.Warn("prefault of host arena stopped", "err", err)
			return
		}
	}
	d.log.Info("host arena prefaulted", "bytes", size, "took", time.Since(t0).Round(time.Millisecond))
}

func (d *Daemon) closeResources() {
	d.closeProbes()
	if d.ln != nil {
		d.ln.Close()
	}
	d.metrics.closeListener()
	if d.nvme != nil {
		if err := d.nvme.Close(); err != nil {
			d.log.Warn("closing nvme tier", "err", err)
		}
		d.nvme = nil
	}
	if d.gpus != nil {
		d.gpus.Close() // unregisters the host arena: before it is unmapped
		d.gpus = nil
	}
	if d.arena != nil {
		d.arena.Close()
	}
	if d.warm.index != nil {
		// A start that failed before adoptWarm: the index systemd passed
		// is closed here (it stays in the store for the next start).
		d.warm.index.Close()
		d.warm.index = nil
	}
	if d.lock != nil {
		d.lock.Close()
	}
}

// peerCred returns the connecting process's credentials (captured by the
// kernel at connect time).
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

func (d *Daemon) refuse(c *net.UnixConn, code shm.ErrCode, msg string) {
	d.metrics.countRefused(code)
	if sendRefusal(c, code, msg, handshakeTimeout) != nil {
		return
	}
	// Closing a Unix socket with unread data (typically the Hello of a peer
	// refused before it was read: unauthorized, shutting down) resets the
	// connection, and the peer's next read returns ECONNRESET instead of
	// the refusal queued for it. Drain until the peer hangs up, bounded.
	c.SetReadDeadline(time.Now().Add(refuseLinger))
	buf := make([]byte, 256)
	for {
		_, _, err := shm.RecvMsg(c, buf, 0) // a truncated or fd-carrying message is consumed too
		if err != nil && !errors.Is(err, shm.ErrMalformed) && !errors.Is(err, shm.ErrTooManyFDs) {
			return
		}
	}
}

// refuseNow is refuse with a short linger, for a flood: it must not hold
// the fd and goroutine it refuses for long. The peer's hello is read
// first, waiting refuseNowWait at most: closing with it unread would reset
// the connection and lose the refusal for a client that reads it (a
// client says hello as soon as it has connected).
func (d *Daemon) refuseNow(c *net.UnixConn, code shm.ErrCode, msg string) {
	d.metrics.countRefused(code)
	d.peerLog.Warn("connection refused", "reason", msg)
	c.SetDeadline(time.Now().Add(refuseNowWait))
	_, _, _ = shm.RecvMsg(c, make([]byte, shm.MaxHelloSize), 0)
	_ = sendRefusal(c, code, msg, 10*time.Millisecond)
}

// sendRefusal writes the refusal message, within bound.
func sendRefusal(c *net.UnixConn, code shm.ErrCode, msg string, bound time.Duration) error {
	e := shm.ErrorMsg{Code: code, Message: msg}
	c.SetWriteDeadline(time.Now().Add(bound))
	return shm.SendMsg(c, shm.EncodeMsg(shm.MsgError, shm.ProtocolVersion, e.Encode()))
}

// allowed reports whether the peer with cred may use the daemon, refusing
// it as unauthorized when not.
func (d *Daemon) allowed(c *net.UnixConn, cred *unix.Ucred, log *slog.Logger) bool {
	if d.cfg.Auth.Allowed(cred.Uid, cred.Gid) {
		return true
	}
	log.Warn("refusing unauthorized peer", "gid", cred.Gid)
	d.refuse(c, shm.CodeUnauthorized, fmt.Sprintf("uid %d gid %d is not allowed to use kvtierd (see auth.uids/auth.gids)", cred.Uid, cred.Gid))
	return false
}

// authorized is allowed for a connection whose credentials are not read
// yet; a peer whose credentials cannot be read is dropped.
func (d *Daemon) authorized(c *net.UnixConn) bool {
	cred, err := peerCred(c)
	if err != nil {
		d.peerLog.Warn("peer credentials unavailable; refusing", "err", err)
		return false
	}
	return d.allowed(c, cred, d.peerLog.With("pid", cred.Pid, "uid", cred.Uid))
}

// serveConn authenticates a connection, runs its handshake and then the
// session until either side ends it.
func (d *Daemon) serveConn(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	if d.preHello.Add(1) > d.maxPreHello {
		d.preHello.Add(-1)
		d.refuseNow(c, shm.CodeBusy, "kvtierd has too many connections in their handshake; try again later")
		return
	}
	helloDone := sync.OnceFunc(func() { d.preHello.Add(-1) })
	defer helloDone()
	cred, err := peerCred(c)
	if err != nil {
		d.peerLog.Warn("peer credentials unavailable; refusing", "err", err)
		return
	}
	log := d.peerLog.With("pid", cred.Pid, "uid", cred.Uid)
	if !d.allowed(c, cred, log) {
		return
	}
	if d.closing.Load() {
		d.refuse(c, shm.CodeShutdown, "kvtierd is shutting down")
		return
	}
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	buf := make([]byte, shm.MaxHelloSize)
	// A shutdown ends a pending handshake now, not at its deadline: a peer
	// that never speaks must not delay the stop.
	endHS := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) })
	raw, fds, err := shm.RecvMsg(c, buf, 0)
	if cut := !endHS(); cut && err != nil {
		// The shutdown cut the wait, not the peer: refused for the
		// shutdown (not counted), as a peer that connects after it.
		d.refuse(c, shm.CodeShutdown, "kvtierd is shutting down")
		return
	}
	if errors.Is(err, io.EOF) {
		// Hung up without a word (a probe of the socket, a client killed
		// while dialling): nobody to refuse, and not a refusal to count.
		log.Debug("peer hung up before its hello")
		return
	}
	if err != nil {
		log.Warn("handshake failed", "err", err)
		d.refuse(c, shm.CodeBadRequest, fmt.Sprintf("bad handshake: %v", err))
		return
	}
	_ = fds // maxFDs 0: any fd was closed and rejected by RecvMsg
	t, ver, payload, err := shm.DecodeMsg(raw)
	if err == nil && t != shm.MsgHello {
		err = fmt.Errorf("expected hello, got message type %d", t)
	}
	if err != nil {
		log.Warn("handshake failed", "err", err)
		d.refuse(c, shm.CodeBadRequest, fmt.Sprintf("bad handshake: %v", err))
		return
	}
	if ver < shm.MinProtocolVersion || ver > shm.ProtocolVersion {
		log.Warn("unsupported protocol version", "version", ver)
		d.refuse(c, shm.CodeVersion, fmt.Sprintf("protocol version %d unsupported; kvtierd speaks %d..%d", ver, shm.MinProtocolVersion, shm.ProtocolVersion))
		return
	}
	hello, err := shm.DecodeHello(payload)
	if err != nil {
		log.Warn("handshake failed", "err", err)
		d.refuse(c, shm.CodeBadRequest, err.Error())
		return
	}
	// The peer has spoken: its deadline ends here. Our writes set their own.
	c.SetReadDeadline(time.Time{})
	helloDone()
	if hello.Flags&shm.HelloFlagAdmin != 0 {
		// Counted, or one process could open them until the daemon has
		// no fd left for anyone's session.
		a := &adminConn{c: c, uid: cred.Uid, since: d.now()}
		if !d.takeAdmin(a, log) {
			d.refuse(c, shm.CodeBusy, fmt.Sprintf("admin connection limit %d reached (session.max_admin) and none of them idle; try again later", d.cfg.Session.MaxAdmin))
			return
		}
		defer d.releaseAdmin(a)
		d.serveAdmin(ctx, a, log)
		return
	}
	s, err := d.newSession(c, cred, hello, log)
	if err != nil {
		return // newSession refused with a reason
	}
	c.SetDeadline(time.Time{})
	s.run()
}

// adminConn is one welcomed admin connection's place under
// session.max_admin. Its fields are guarded by Daemon.mu.
type adminConn struct {
	c        *net.UnixConn
	uid      uint32
	busy     bool      // answering a request (not waiting for the next)
	since    time.Time // when it last began waiting for a request
	displace bool      // its place was given to a newer connection
	seq      uint64    // order of welcome: ties go to the older
}

// takeAdmin gives a an admin place, reporting false when all
// session.max_admin places are taken by connections answering a request.
//
// When every place is taken, the connection that has waited longest for its
// next request gives its place up, taken from the uid holding the most
// places: otherwise a process that sends a request now and then on each of
// session.max_admin connections (under adminIdle, which closes only the
// silent ones) locks kvtierctl out for as long as it likes. With the
// places going to the newest connection, such a process keeps at most what
// others leave it, and another user's kvtierctl always gets in.
func (d *Daemon) takeAdmin(a *adminConn, log *slog.Logger) bool {
	d.mu.Lock()
	if d.admins == nil {
		d.admins = map[*adminConn]struct{}{}
	}
	var v *adminConn
	if len(d.admins) >= d.cfg.Session.MaxAdmin {
		if v = adminToDisplace(d.admins); v == nil {
			d.mu.Unlock()
			return false
		}
		// Its wait for a request ends now; serveAdmin sees displace and
		// returns without reading another request.
		v.displace = true
		v.c.SetReadDeadline(time.Now())
		delete(d.admins, v)
	}
	d.adminSeq++
	a.seq = d.adminSeq
	d.admins[a] = struct{}{}
	d.mu.Unlock()
	if v != nil {
		// v's fields no longer change: it is out of the map.
		log.Info("admin connection limit reached (session.max_admin): closing the connection idle longest", "idle_uid", v.uid, "idle", d.now().Sub(v.since).Round(time.Millisecond))
	}
	return true
}

// adminToDisplace picks the admin connection to close for a newer one: of
// those waiting for a request, one of the uid holding the most places (the
// lowest uid on a tie, so the choice does not depend on map order), the
// one waiting longest. Nil when every one is answering a request.
func adminToDisplace(admins map[*adminConn]struct{}) *adminConn {
	held := map[uint32]int{}
	for a := range admins {
		if !a.busy {
			held[a.uid]++
		}
	}
	var uid uint32
	most := 0
	for u, n := range held {
		if n > most || (n == most && u < uid) {
			uid, most = u, n
		}
	}
	var v *adminConn
	for a := range admins {
		if a.busy || a.uid != uid {
			continue
		}
		if v == nil || a.since.Before(v.since) || (a.since.Equal(v.since) && a.seq < v.seq) {
			v = a
		}
	}
	return v
}

func (d *Daemon) releaseAdmin(a *adminConn) {
	d.mu.Lock()
	delete(d.admins, a)
	d.mu.Unlock()
}

// adminWait marks a as waiting for its next request, with its idle bound,
// reporting false if its place was given up to a newer connection.
func (d *Daemon) adminWait(a *adminConn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if a.displace {
		return false
	}
	if a.busy { // else waiting since its welcome (takeAdmin)
		a.since = d.now()
	}
	a.busy = false
	// Under d.mu: a displacement's deadline must not be overwritten.
	a.c.SetReadDeadline(time.Now().Add(d.adminIdle))
	return true
}

// adminBusy marks a as answering a request, reporting false if its place
// was given up while it waited (the request is not answered).
func (d *Daemon) adminBusy(a *adminConn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if a.displace {
		return false
	}
	a.busy = true
	return true
}

// serveAdmin answers control-only requests (status, evict) until the peer
// hangs up.
func (d *Daemon) serveAdmin(ctx context.Context, a *adminConn, log *slog.Logger) {
	c := a.c
	w := shm.Welcome{}
	c.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgWelcome, shm.ProtocolVersion, w.Encode())); err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	// A stop ends the wait for the next request at once, and leaves the
	// reply in progress (a flush the stop cut says so) its own short bound:
	// a peer that never reads its replies blocks our write, and Run waits
	// for this goroutine.
	stop := context.AfterFunc(ctx, func() {
		c.SetReadDeadline(time.Now())
		c.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	})
	defer stop()
	buf := make([]byte, 4096)
	for {
		if !d.adminWait(a) {
			return
		}
		if ctx.Err() != nil {
			return // the stop's deadline, which adminWait may have moved
		}
		raw, _, err := shm.RecvMsg(c, buf, 0)
		if !d.adminBusy(a) {
			return // displaced by a newer connection (takeAdmin)
		}
		if errors.Is(err, shm.ErrMalformed) || errors.Is(err, shm.ErrTooManyFDs) {
			log.Warn("closing admin connection", "reason", err) // any fds were closed
			return
		}
		if err != nil {
			return
		}
		if err := d.control(ctx, c, raw, d.adminReply); err != nil {
			log.Warn("closing admin connection", "reason", err)
			return
		}
	}
}

// control answers one out-of-band request. ctx ends with the connection's
// server (Run, for an admin connection; the session, for one on a session's
// socket): a stop cuts a flush in progress, and the stop's own write-down
// (nvme.flush_on_stop) carries on where it left off, within its own bound.
// replyBound, if not 0, bounds the write of the reply (sendReply).
func (d *Daemon) control(ctx context.Context, c *net.UnixConn, raw []byte, replyBound time.Duration) error {
	t, _, payload, err := shm.DecodeMsg(raw)
	if err != nil {
		return err
	}
	switch t {
	case shm.MsgStatsReq:
		if len(payload) != 0 {
			return fmt.Errorf("%w: stats request with %d payload bytes", shm.ErrMalformed, len(payload))
		}
		b, err := json.Marshal(d.Stats())
		if err != nil {
			return err
		}
		return sendReply(ctx, c, shm.EncodeMsg(shm.MsgStatsReply, shm.ProtocolVersion, b), replyBound)
	case shm.MsgEvictReq:
		req, err := shm.DecodeEvictReq(payload)
		if err != nil {
			return err
		}
		var n int
		if req.All {
			n = d.deleteNamespaces(slices.Collect(maps.Keys(d.reg.All())))
		} else {
			n = d.deleteNS(req.NamespaceID)
		}
		d.peerLog.Info("evicted blocks on request", "namespace", req.NamespaceID, "all", req.All, "blocks", n)
		b, _ := json.Marshal(map[string]int{"evicted": n})
		return sendReply(ctx, c, shm.EncodeMsg(shm.MsgEvictReply, shm.ProtocolVersion, b), replyBound)
	case shm.MsgFlushReq:
		if len(payload) != 0 {
			return fmt.Errorf("%w: flush request with %d payload bytes", shm.ErrMalformed, len(payload))
		}
		t0 := time.Now()
		// Bound by ctx too: Run waits for this goroutine before its own
		// write-down, and a flush that ran on for its whole bound would
		// put the stop past systemd's TimeoutStopSec.
		fctx, cancel := context.WithTimeout(ctx, flushTimeout)
		n, ferr := d.chain.Flush(fctx)
		cancel()
		d.peerLog.Info("host tier written down to nvme on request", "blocks", n, "took", time.Since(t0).Round(time.Millisecond), "err", ferr)
		reply := map[string]any{"blocks": n}
		if ferr != nil { // partial: n blocks went down before it
			reply["error"] = d.flushCutReason(ctx, ferr)
		}
		b, _ := json.Marshal(reply)
		return sendReply(ctx, c, shm.EncodeMsg(shm.MsgFlushReply, shm.ProtocolVersion, b), replyBound)
	default:
		return fmt.Errorf("%w: unexpected message type %d", shm.ErrMalformed, t)
	}
}

// sendReply writes a control reply, within bound if it is not 0 (an admin
// connection's: adminReplyTimeout), an error if the peer did not read it
// in time. Once ctx has ended (a stop) the write gets handshakeTimeout, as
// serveAdmin's stop sets it, whether the stop came before or after the
// deadline set here.
func sendReply(ctx context.Context, c *net.UnixConn, msg []byte, bound time.Duration) error {
	if bound > 0 {
		c.SetWriteDeadline(time.Now().Add(bound))
		if ctx.Err() != nil {
			c.SetWriteDeadline(time.Now().Add(min(bound, handshakeTimeout)))
		}
	}
	err := shm.SendMsg(c, msg)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("reply not read within %s: %w", bound, err)
	}
	return err
}

// flushCutReason says why a flush on request ended early, in the words
// kvtierctl prints: a stop cut it (and whether the stop writes the rest
// down), its bound ran out, or the write-down failed.
func (d *Daemon) flushCutReason(ctx context.Context, err error) string {
	switch {
	case ctx.Err() != nil && d.cfg.NVMe.FlushOnStop:
		return "kvtierd is stopping: it cut this flush and writes the rest down itself (nvme.flush_on_stop)"
	case ctx.Err() != nil:
		return "kvtierd is stopping: it cut this flush, and nvme.flush_on_stop is off, so the rest is not written down"
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("the flush ran past its bound of %s; run it again to write the rest", flushTimeout)
	default:
		return err.Error()
	}
}

// hostEvictions counts the blocks that left the host tier without a copy
// below: dropped at allocation to make room, and blocks the policy refused
// or NVMe cannot hold, which the mover drops instead of writing them down.
func hostEvictions(hs tiers.HostStats, cs tiers.ChainStats) uint64 {
	return hs.Evictions + cs.RefusedDrops + cs.OversizeDrops
}

// Stats reports the daemon's state.
func (d *Daemon) Stats() shm.Stats {
	hs := d.host.Stats()
	cs := d.chain.Stats()
	ratio := 0.0
	if hs.Hits+hs.Misses > 0 {
		ratio = float64(hs.Hits) / float64(hs.Hits+hs.Misses)
	}
	st := shm.Stats{
		Version: Version, PID: os.Getpid(), UptimeSeconds: time.Since(d.start).Seconds(),
		Socket: d.cfg.Socket, StateDir: d.cfg.StateDir,
		Tiers: []shm.TierStats{{
			Name: "host", CapacityBytes: d.hostCapacity(hs.CapacityBytes), UsedBytes: hs.UsedBytes, Blocks: hs.Blocks,
			Reserved: hs.Reserved, Leased: hs.Leased, Hits: hs.Hits, Misses: hs.Misses,
			Evictions: hostEvictions(hs, cs), HitRatio: ratio, HugePages: d.arena.Huge,
			Compactions: hs.Compactions, CompactedBlocks: hs.CompactedBlocks, SlabBytes: hs.SlabBytes,
		}},
		SessionsTotal: d.sessionsTotal.Load(), SessionsBad: d.sessionsBad.Load(),
		Ops: map[string]uint64{},
	}
	if d.nvme != nil {
		st.Tiers[0].HighWatermark, _ = d.chain.ConfiguredWatermarks()
		ns := d.nvme.Stats()
		nr := 0.0
		if cs.NVMeHits+cs.NVMeMisses > 0 {
			nr = float64(cs.NVMeHits) / float64(cs.NVMeHits+cs.NVMeMisses)
		}
		st.Tiers = append(st.Tiers, shm.TierStats{
			Name: "nvme", CapacityBytes: ns.Capacity, UsedBytes: ns.Bytes, DiskBytes: ns.DiskBytes, Blocks: ns.Blocks,
			Hits: cs.NVMeHits, Misses: cs.NVMeMisses, Evictions: ns.Evictions, HitRatio: nr,
			ChecksumMisses: ns.ChecksumMisses,
		})
	}
	st.ParkedBlocks = cs.ParkedBlocks
	d.probeStats(&st) // ebpf.go
	st.Moves = []shm.MoveStats{
		{From: "host", To: "nvme", Blocks: cs.Demoted, Bytes: cs.DemotedBytes, Errors: cs.DemoteErrors, Seconds: cs.SwapOut.Seconds()},
		{From: "nvme", To: "host", Blocks: cs.Promoted, Bytes: cs.PromotedBytes, Errors: cs.PromoteErrors, Seconds: cs.SwapIn.Seconds()},
	}
	d.gpuStats(&st) // gpu.go
	for op := shm.OpLookup; op.Valid(); op++ {
		st.Ops[op.String()] = d.ops[op].Load()
	}
	perNS := map[uint32]int{}
	d.mu.Lock()
	st.Sessions = len(d.sessions)
	for _, s := range d.sessions {
		perNS[s.nsID]++
	}
	d.mu.Unlock()
	st.Namespaces, st.NamespacesTotal = listNamespaces(d.reg.All(), perNS)
	return st
}

// statsNamespaceBytes bounds the JSON of the namespaces a status reply
// lists. The reply is one SOCK_SEQPACKET message, which the socket's send
// buffer caps (net.core.wmem_default, 208 KiB on most hosts), and a peer
// registers namespaces at will (up to 65,536): listed whole, a few hundred with
// long model ids made every status request fail.
const statsNamespaceBytes = 64 << 10

// listNamespaces lists the namespaces with sessions first, then the others
// by id, up to statsNamespaceBytes of JSON, and returns them with how many
// there are.
func listNamespaces(all map[uint32]NamespaceSpec, sessions map[uint32]int) ([]shm.NamespaceStats, int) {
	ids := slices.Collect(maps.Keys(all))
	slices.SortFunc(ids, func(a, b uint32) int {
		if ua, ub := sessions[a] > 0, sessions[b] > 0; ua != ub {
			if ua {
				return -1
			}
			return 1
		}
		return cmp.Compare(a, b)
	})
	var out []shm.NamespaceStats
	size := 0
	for _, id := range ids {
		ns := shm.NamespaceStats{ID: id, Namespace: all[id], Sessions: sessions[id]}
		b, err := json.Marshal(ns)
		if err != nil {
			continue
		}
		if size += len(b) + 1; size > statsNamespaceBytes {
			break
		}
		out = append(out, ns)
	}
	return out, len(all)
}
