package daemon

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/dustin/go-humanize"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/policy"
)

// Config is the daemon's effective configuration: embedded defaults, then a
// TOML file, then command-line flags. Fields whose default depends on other
// fields (Socket, Host.Capacity) stay zero until ApplyDerived so that an
// override of the field they derive from also moves them.
type Config struct {
	RuntimeDir string        `toml:"runtime_dir"`
	StateDir   string        `toml:"state_dir"`
	Socket     string        `toml:"socket"`
	Log        LogConfig     `toml:"log"`
	Auth       AuthConfig    `toml:"auth"`
	Host       HostConfig    `toml:"host"`
	Session    SessionConfig `toml:"session"`
	NVMe       NVMeConfig    `toml:"nvme"`
	Metrics    MetricsConfig `toml:"metrics"`
	EBPF       EBPFConfig    `toml:"ebpf"`
	GPU        GPUConfig     `toml:"gpu"`
}

// GPUConfig sizes the GPU tier: one daemon-owned arena per GPU, exported by
// CUDA IPC to the clients on that GPU. Off when no GPU is found.
type GPUConfig struct {
	Enabled bool `toml:"enabled"`
	// ArenaBytes per GPU; 0 means ArenaFraction of the GPU's free memory.
	ArenaBytes    ByteSize `toml:"arena_bytes"`
	ArenaFraction float64  `toml:"arena_fraction"`
	// SlabBytes of the GPU arenas' allocator; 0 means host.slab_bytes.
	SlabBytes ByteSize `toml:"slab_bytes"`
	// Above HighWatermark (fraction of an arena) the coldest blocks are
	// demoted to the host tier until LowWatermark.
	HighWatermark float64 `toml:"high_watermark"`
	LowWatermark  float64 `toml:"low_watermark"`
}

// EBPFConfig allows the eBPF probes (see ebpf/doc.go): client exit
// tracing, NVMe I/O latency, direct-reclaim stalls. Each one that the kernel
// or the privileges do not allow is logged and replaced by its fallback.
type EBPFConfig struct {
	Enabled bool `toml:"enabled"`
}

// MetricsConfig places the Prometheus endpoint (see docs/metrics.md).
type MetricsConfig struct {
	// Listen is the TCP host:port serving /metrics; "" disables metrics.
	// Loopback by default: the figures describe other users' workloads.
	Listen string `toml:"listen"`
}

// NVMeConfig sizes the NVMe tier (Badger, in <state_dir>/nvme).
type NVMeConfig struct {
	// Enabled turns the tier on; without it the host tier drops what it
	// evicts.
	Enabled bool `toml:"enabled"`
	// Capacity is the on-disk budget; 0 means "size from the disk": half of
	// the free space of the state dir's filesystem, at most 1 TiB.
	Capacity ByteSize `toml:"capacity"`
	// FlushOnStop writes the GPU-only blocks (through the host tier) and the
	// host tier down to NVMe on SIGTERM so a restart or an upgrade keeps the
	// cache warm. Off, a stop still writes down the parked blocks not yet
	// written through (parked requests survive a stop).
	FlushOnStop bool `toml:"flush_on_stop"`
	// StopBudgetSeconds bounds the stop: its write-down ends this long
	// after SIGTERM at the latest, whatever the drain of the sessions
	// took. The default leaves the unit's TimeoutStopSec (90 s) 15 s for
	// closing Badger and storing the warm-restart snapshot. Parked blocks
	// not yet written down get parkedStopGrace even past it.
	StopBudgetSeconds int `toml:"stop_budget_s"`
	// ParkTTLSeconds is how long a parked request is kept without being
	// resumed or released.
	ParkTTLSeconds int `toml:"park_ttl_s"`
	// ParkedShare caps the parked blocks on NVMe at this fraction of its
	// budget: past it a Park is refused (ErrFull) and the engine
	// recomputes, so one engine parking without end cannot evict every
	// other model's cache. 1: the whole budget.
	ParkedShare float64 `toml:"parked_share"`
}

// LogConfig selects the slog handler.
type LogConfig struct {
	Level  string `toml:"level"`  // debug|info|warn|error
	Format string `toml:"format"` // text|json
}

// AuthConfig lists the peers (checked with SO_PEERCRED) allowed on the
// control socket: a peer is allowed if its uid is in UIDs or its gid is in
// GIDs.
type AuthConfig struct {
	UIDs []uint32 `toml:"uids"`
	GIDs []uint32 `toml:"gids"`
}

// Allowed reports whether a peer with these credentials may connect.
func (a AuthConfig) Allowed(uid, gid uint32) bool {
	return slices.Contains(a.UIDs, uid) || slices.Contains(a.GIDs, gid)
}

// HostConfig sizes the host-memory (memfd) tier.
type HostConfig struct {
	// Capacity of the arena; 0 means "size from the machine" (see ApplyDerived).
	Capacity  ByteSize `toml:"capacity"`
	SlabBytes ByteSize `toml:"slab_bytes"`
	HugePages bool     `toml:"hugepages"`
	Prefault  bool     `toml:"prefault"`
	// Above HighWatermark (a fraction of capacity) the mover demotes the
	// coldest blocks to NVMe until the tier is at LowWatermark.
	HighWatermark float64 `toml:"high_watermark"`
	LowWatermark  float64 `toml:"low_watermark"`
	// Policy picks the blocks the mover demotes (see tiers/policy).
	Policy string `toml:"policy"`
	// CapacityAuto records that Capacity was sized from machine memory
	// (host.capacity unset). A warm restart then keeps the size of the
	// arena systemd stored: the memory that arena holds would make the
	// new estimate smaller, and the arena would be discarded.
	CapacityAuto bool `toml:"-"`
}

// SessionConfig sizes per-session shared memory and the ring loop.
type SessionConfig struct {
	RingEntries int      `toml:"ring_entries"`
	DataBytes   ByteSize `toml:"data_bytes"`
	MaxSessions int      `toml:"max_sessions"`
	// MaxAdmin bounds the admin connections (status, evict, flush) open at
	// once: each holds a goroutine and an fd, and a peer opens them at will.
	MaxAdmin int `toml:"max_admin"`
	// SpinMicros is how long an idle session's ring loop polls before it
	// sleeps on the futex doorbell. Waking a sleeping thread costs ~60 µs
	// on virtual machines, more than a whole 2 MiB copy, so the default
	// covers the gap between a client's back-to-back requests.
	SpinMicros int `toml:"spin_us"`
}

const (
	KiB = 1 << 10
	MiB = 1 << 20
	GiB = 1 << 30

	defaultSlabBytes = 64 * MiB
	maxAutoCapacity  = 64 * GiB
	// fallbackMemory is assumed when machine memory cannot be read (non-Linux,
	// no /proc): small enough to be safe anywhere.
	fallbackMemory = 4 * GiB

	// sun_path is 108 bytes on Linux including the terminating NUL.
	maxSocketPath = 107

	socketName = "kvtierd.sock"

	defaultMetricsListen = "127.0.0.1:9477"
)

// ByteSize is a size in bytes. In TOML it is an integer (bytes) or a string
// with a unit ("4GiB", "512MB", parsed by go-humanize); the same strings work
// for flags.
type ByteSize uint64

// String prints the exact value, using the largest binary unit that divides
// it, so that it round-trips through UnmarshalText.
func (b ByteSize) String() string {
	v := uint64(b)
	switch {
	case v == 0:
		return "0"
	case v%GiB == 0:
		return strconv.FormatUint(v/GiB, 10) + "GiB"
	case v%MiB == 0:
		return strconv.FormatUint(v/MiB, 10) + "MiB"
	case v%KiB == 0:
		return strconv.FormatUint(v/KiB, 10) + "KiB"
	}
	return strconv.FormatUint(v, 10)
}

// MarshalText implements encoding.TextMarshaler.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *ByteSize) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	v, err := humanize.ParseBytes(s)
	if err != nil {
		return fmt.Errorf("invalid byte size %q (want bytes or a size like \"4GiB\", \"512MB\")", s)
	}
	*b = ByteSize(v)
	return nil
}

// Set implements flag.Value.
func (b *ByteSize) Set(s string) error { return b.UnmarshalText([]byte(s)) }

// UnmarshalTOML implements toml.Unmarshaler so that TOML integers are taken
// exactly (the TextUnmarshaler path would reformat them, and accept floats).
func (b *ByteSize) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return fmt.Errorf("invalid byte size %d: negative", x)
		}
		*b = ByteSize(x)
		return nil
	case string:
		return b.UnmarshalText([]byte(x))
	}
	return fmt.Errorf("invalid byte size %v: want an integer or a string like \"4GiB\"", v)
}

// memInfo is the machine memory the defaults are sized from, in bytes.
type memInfo struct {
	Total, Available uint64
}

// env is what the defaults depend on, injectable for tests.
type env struct {
	Getenv  func(string) string
	Euid    func() int
	MemInfo func() (memInfo, error)
	// HostCapacity, if set, is what an unset host.capacity means instead of
	// sizing from memory: a reload keeps the running arena's size.
	HostCapacity ByteSize
	// HostSlab, if set, is the slab size of the arena HostCapacity sizes:
	// a kept capacity is a whole number of the running slabs, whatever
	// host.slab_bytes (which needs a restart) now says.
	HostSlab ByteSize
}

func systemEnv() env {
	return env{Getenv: os.Getenv, Euid: os.Geteuid, MemInfo: readMemInfo}
}

// base returns the embedded defaults with derived fields left zero.
func (e env) base() Config {
	euid := e.Euid()
	c := Config{
		Log:  LogConfig{Level: "info", Format: "text"},
		Auth: AuthConfig{UIDs: []uint32{uint32(euid)}},
		Host: HostConfig{SlabBytes: defaultSlabBytes, Prefault: true, HighWatermark: 0.95, LowWatermark: 0.85,
			Policy: policy.Default},
		NVMe:    NVMeConfig{Enabled: true, FlushOnStop: true, StopBudgetSeconds: 75, ParkTTLSeconds: 3600, ParkedShare: 0.5},
		Metrics: MetricsConfig{Listen: defaultMetricsListen},
		EBPF:    EBPFConfig{Enabled: true},
		GPU:     GPUConfig{Enabled: true, ArenaFraction: 0.5, HighWatermark: 0.9, LowWatermark: 0.8},
		Session: SessionConfig{
			RingEntries: 1024,
			DataBytes:   1 * MiB,
			MaxSessions: 1024,
			MaxAdmin:    64,
			SpinMicros:  200,
		},
	}
	// Root may always talk to the daemon; it could ptrace it anyway.
	if euid != 0 {
		c.Auth.UIDs = append(c.Auth.UIDs, 0)
	}
	// Clients find the socket by the same rule (shm owns it).
	c.RuntimeDir = shm.DefaultRuntimeDir(euid, e.Getenv)
	if euid == 0 {
		c.StateDir = "/var/lib/kvtier"
		return c
	}
	// XDG says relative paths in these variables must be ignored.
	if d := e.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		c.StateDir = filepath.Join(d, "kvtier")
	} else if h := e.Getenv("HOME"); filepath.IsAbs(h) {
		c.StateDir = filepath.Join(h, ".local", "state", "kvtier")
	} else {
		// No home (e.g. a bare service account): state does not survive a
		// reboot, but the daemon still starts with no configuration.
		c.StateDir = filepath.Join(c.RuntimeDir, "state")
	}
	return c
}

// derive fills the fields whose defaults depend on other fields. kept
// reports that host.capacity was unset and took e.HostCapacity.
func (e env) derive(c *Config) (kept bool) {
	if c.Socket == "" && c.RuntimeDir != "" {
		c.Socket = filepath.Join(c.RuntimeDir, socketName)
	}
	if c.Host.Capacity == 0 && e.HostCapacity != 0 {
		c.Host.Capacity, kept = e.HostCapacity, true
	}
	if c.Host.Capacity == 0 {
		c.Host.Capacity = autoCapacity(e.MemInfo, c.Host.SlabBytes)
		c.Host.CapacityAuto = true
	}
	return kept
}

// autoCapacity leaves room for the inference processes themselves: a quarter
// of RAM, at most half of what is free now, capped at 64 GiB, whole slabs, at
// least two.
func autoCapacity(mi func() (memInfo, error), slab ByteSize) ByteSize {
	m, err := mi()
	if err != nil || m.Total == 0 {
		m = memInfo{Total: fallbackMemory, Available: fallbackMemory}
	}
	c := min(m.Total/4, m.Available/2, maxAutoCapacity)
	s := uint64(slab)
	if s == 0 || bits.OnesCount64(s) != 1 {
		return ByteSize(c) // Validate reports the bad slab size
	}
	c -= c % s
	return ByteSize(max(c, 2*s))
}

// DefaultConfig returns the embedded defaults for this process (uid,
// XDG variables, machine memory), with derived fields filled.
func DefaultConfig() (Config, error) {
	e := systemEnv()
	c := e.base()
	e.derive(&c)
	return c, nil
}

// ApplyDerived fills Socket from RuntimeDir and Host.Capacity from machine
// memory when they were not set. It never overwrites a set value.
func (c *Config) ApplyDerived() { systemEnv().derive(c) }

// LoadConfig returns the defaults with the TOML file at path on top ("" means
// no file), derived and validated.
func LoadConfig(path string) (Config, error) { return systemEnv().load(path, nil) }

func (e env) load(path string, override func(*Config)) (Config, error) {
	c := e.base()
	if path != "" {
		if err := decodeFile(path, &c); err != nil {
			return Config{}, err
		}
	}
	if override != nil {
		override(&c)
	}
	capSlab := c.Host.SlabBytes
	if e.derive(&c) && e.HostSlab != 0 {
		capSlab = e.HostSlab // the running arena's, which this capacity sizes
	}
	err := c.validate(capSlab)
	if e.HostCapacity == 0 && !c.Host.CapacityAuto {
		// At start only: a reload caps host.capacity at the arena.
		err = errors.Join(err, e.checkMemory(c.Host.Capacity))
	}
	if err != nil {
		return Config{}, err
	}
	return c, nil
}

// checkMemory refuses a host.capacity the machine's memory (clamped to the
// cgroup limit) could never back: the arena's pages are memory the daemon
// holds, and the background prefault alone would fault them in until the
// OOM killer ended kvtierd.
func (e env) checkMemory(capacity ByteSize) error {
	m, err := e.MemInfo()
	if err != nil || m.Total == 0 || uint64(capacity) <= m.Total {
		return nil
	}
	return &FieldError{Field: "host.capacity", Msg: fmt.Sprintf(
		"%v is more than the machine's memory (%s, or the cgroup's memory limit); the arena could never be backed",
		capacity, humanize.IBytes(m.Total))}
}

func decodeFile(path string, c *Config) error {
	md, err := toml.DecodeFile(path, c)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return fmt.Errorf("config %s: %s", path, pe.ErrorWithPosition())
		}
		return fmt.Errorf("config %s: %w", path, err)
	}
	// A misspelt key silently ignored is worse than a refusal to start.
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return fmt.Errorf("config %s: unknown key(s): %s", path, strings.Join(keys, ", "))
	}
	return nil
}

// FieldError is a validation failure of one field, named in TOML dotted form.
type FieldError struct {
	Field string // e.g. "host.slab_bytes"
	Flag  string // the command-line flag that set it, if any
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Flag != "" {
		return fmt.Sprintf("%s (flag -%s): %s", e.Field, e.Flag, e.Msg)
	}
	return e.Field + ": " + e.Msg
}

// Validate checks every field and reports all failures at once (joined),
// each a *FieldError.
func (c *Config) Validate() error { return c.validate(c.Host.SlabBytes) }

// validate is Validate with host.capacity checked against capSlab, the slab
// size of the arena it sizes: host.slab_bytes at a start; the running
// arena's at a reload, where host.slab_bytes needs a restart and
// host.capacity is a target within the running arena.
func (c *Config) validate(capSlab ByteSize) error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	for _, p := range []struct{ field, v string }{
		{"runtime_dir", c.RuntimeDir}, {"state_dir", c.StateDir}, {"socket", c.Socket},
	} {
		if !filepath.IsAbs(p.v) {
			bad(p.field, "must be an absolute path, got %q", p.v)
		}
	}
	if len(c.Socket) > maxSocketPath {
		bad("socket", "path is %d bytes, longer than the %d a Unix socket address holds", len(c.Socket), maxSocketPath)
	}
	if _, err := parseLevel(c.Log.Level); err != nil {
		bad("log.level", "must be one of debug, info, warn, error, got %q", c.Log.Level)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		bad("log.format", "must be text or json, got %q", c.Log.Format)
	}
	if len(c.Auth.UIDs) == 0 && len(c.Auth.GIDs) == 0 {
		bad("auth.uids", "auth.uids and auth.gids are both empty, so no client could connect")
	}

	slab := uint64(c.Host.SlabBytes)
	slabOK := slab >= MiB && slab <= GiB && bits.OnesCount64(slab) == 1
	if !slabOK {
		bad("host.slab_bytes", "must be a power of two between 1MiB and 1GiB, got %v", c.Host.SlabBytes)
	}
	cs := uint64(capSlab)
	csOK := cs >= MiB && cs <= GiB && bits.OnesCount64(cs) == 1
	if c.Host.Capacity > math.MaxInt64 {
		bad("host.capacity", "must be at most %d bytes, got %d", int64(math.MaxInt64), uint64(c.Host.Capacity))
	} else if capa := uint64(c.Host.Capacity); csOK && (capa%cs != 0 || capa < 2*cs) {
		what := "host.slab_bytes"
		if capSlab != c.Host.SlabBytes {
			what = "the running arena's slab size"
		}
		bad("host.capacity", "must be a multiple of %s (%v) and at least two slabs, got %v", what, capSlab, c.Host.Capacity)
	}

	if !slices.Contains(policy.Names(), c.Host.Policy) {
		bad("host.policy", "must be one of %v, got %q", policy.Names(), c.Host.Policy)
	}
	if w := c.Host.HighWatermark; !(w > 0 && w <= 1) {
		bad("host.high_watermark", "must be in (0, 1], got %v", w)
	}
	if w := c.Host.LowWatermark; !(w > 0 && w < c.Host.HighWatermark) {
		bad("host.low_watermark", "must be in (0, host.high_watermark), got %v", w)
	}
	if t := c.NVMe.ParkTTLSeconds; t <= 0 || int64(t) > math.MaxInt64/int64(time.Second) {
		bad("nvme.park_ttl_s", "must be between 1 and %d, got %d", math.MaxInt64/int64(time.Second), t)
	}
	if f := c.NVMe.ParkedShare; !(f > 0 && f <= 1) {
		bad("nvme.parked_share", "must be in (0, 1], got %v", f)
	}
	if t := c.NVMe.StopBudgetSeconds; t <= 0 || t > maxStopBudget {
		bad("nvme.stop_budget_s", "must be between 1 and %d, got %d", maxStopBudget, t)
	}
	if c.NVMe.Capacity > math.MaxInt64 {
		bad("nvme.capacity", "must be at most %d bytes, got %d", int64(math.MaxInt64), uint64(c.NVMe.Capacity))
	}
	if capa := c.NVMe.Capacity; c.NVMe.Enabled && capa != 0 && capa < 64*MiB {
		bad("nvme.capacity", "must be 0 (auto) or at least 64MiB, got %v", capa)
	}

	if err := validListen(c.Metrics.Listen); err != nil {
		bad("metrics.listen", "must be host:port (e.g. %q) or \"\" to disable, got %q: %v", defaultMetricsListen, c.Metrics.Listen, err)
	}

	if f := c.GPU.ArenaFraction; !(f > 0 && f <= 1) {
		bad("gpu.arena_fraction", "must be in (0, 1], got %v", f)
	}
	if sb := uint64(c.GPU.SlabBytes); sb != 0 && (sb < MiB || sb > GiB || bits.OnesCount64(sb) != 1) {
		bad("gpu.slab_bytes", "must be 0 (host.slab_bytes) or a power of two between 1MiB and 1GiB, got %v", c.GPU.SlabBytes)
	}
	// Each GPU's arena is carved into whole slabs: one under a slab could
	// hold no block (the GPU tier would be switched off at start).
	gpuSlab := c.GPU.SlabBytes
	if gpuSlab == 0 {
		gpuSlab = c.Host.SlabBytes
	}
	if a := c.GPU.ArenaBytes; a > math.MaxInt64 {
		bad("gpu.arena_bytes", "must be at most %d bytes, got %d", int64(math.MaxInt64), uint64(a))
	} else if a != 0 && a < gpuSlab {
		bad("gpu.arena_bytes", "must be 0 (gpu.arena_fraction of free GPU memory) or at least one GPU slab (%v), got %v", gpuSlab, a)
	}
	if w := c.GPU.HighWatermark; !(w > 0 && w <= 1) {
		bad("gpu.high_watermark", "must be in (0, 1], got %v", w)
	}
	if w := c.GPU.LowWatermark; !(w > 0 && w < c.GPU.HighWatermark) {
		bad("gpu.low_watermark", "must be in (0, gpu.high_watermark), got %v", w)
	}

	if r := c.Session.RingEntries; r < 64 || r > 65536 || r&(r-1) != 0 {
		bad("session.ring_entries", "must be a power of two between 64 and 65536, got %d", r)
	}
	if d := c.Session.DataBytes; d < 64*KiB || d > 64*MiB {
		bad("session.data_bytes", "must be between 64KiB and 64MiB, got %v", d)
	}
	if c.Session.MaxSessions <= 0 {
		bad("session.max_sessions", "must be positive, got %d", c.Session.MaxSessions)
	}
	if a := c.Session.MaxAdmin; a <= 0 || a > 65536 {
		bad("session.max_admin", "must be between 1 and 65536, got %d", a)
	}
	if s := c.Session.SpinMicros; s < 0 || s > 10000 {
		bad("session.spin_us", "must be between 0 and 10000, got %d", s)
	}
	return errors.Join(errs...)
}

func parseLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q", s)
}

// Flags are the command-line overrides. Bind them with BindFlags, parse the
// FlagSet, then call Load.
type Flags struct {
	fs         *flag.FlagSet
	configPath string
	runtimeDir string
	stateDir   string
	socket     string
	capacity   ByteSize
	nvmeCap    ByteSize
	noNVMe     bool
	logLevel   string
	logFormat  string
	metrics    string
}

// flagFields maps each overriding flag to the config field it sets, so that
// validation errors can name both.
var flagFields = map[string]string{
	"runtime-dir":    "runtime_dir",
	"state-dir":      "state_dir",
	"socket":         "socket",
	"host-capacity":  "host.capacity",
	"nvme-capacity":  "nvme.capacity",
	"log-level":      "log.level",
	"log-format":     "log.format",
	"metrics-listen": "metrics.listen",
}

// BindFlags defines kvtierd's configuration flags on fs. The caller may add
// its own flags to fs before parsing.
func BindFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{fs: fs}
	fs.StringVar(&f.configPath, "config", "", "path of a TOML config `file` (none by default)")
	fs.StringVar(&f.runtimeDir, "runtime-dir", "", "runtime `dir` (socket); default /run/kvtier as root, else $XDG_RUNTIME_DIR/kvtier")
	fs.StringVar(&f.stateDir, "state-dir", "", "state `dir` (namespace registry, NVMe tier); default /var/lib/kvtier as root, else $XDG_STATE_HOME/kvtier")
	fs.StringVar(&f.socket, "socket", "", "control socket `path`; default <runtime-dir>/"+socketName)
	fs.Var(&f.capacity, "host-capacity", "host tier `size`, e.g. 16GiB; default from machine memory")
	fs.Var(&f.nvmeCap, "nvme-capacity", "NVMe tier disk budget `size`, e.g. 200GiB; default half the free space of the state dir")
	fs.BoolVar(&f.noNVMe, "no-nvme", false, "run without the NVMe tier")
	fs.StringVar(&f.logLevel, "log-level", "", "log `level`: debug, info, warn, error (default info)")
	fs.StringVar(&f.logFormat, "log-format", "", "log `format`: text or json (default text)")
	fs.StringVar(&f.metrics, "metrics-listen", "", "Prometheus metrics `host:port` (default "+defaultMetricsListen+"; \"\" disables)")
	return f
}

// Load builds the config from defaults, the -config file and the flags that
// were set on the command line (flags win), then derives and validates.
func (f *Flags) Load() (Config, error) { return f.load(systemEnv()) }

func (f *Flags) load(e env) (Config, error) {
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	c, err := e.load(f.configPath, func(c *Config) {
		// Only flags actually given override: an empty default must not
		// clobber a file value.
		if set["runtime-dir"] {
			c.RuntimeDir = f.runtimeDir
		}
		if set["state-dir"] {
			c.StateDir = f.stateDir
		}
		if set["socket"] {
			c.Socket = f.socket
		}
		if set["host-capacity"] {
			c.Host.Capacity = f.capacity
		}
		if set["nvme-capacity"] {
			c.NVMe.Capacity = f.nvmeCap
		}
		if set["no-nvme"] {
			c.NVMe.Enabled = !f.noNVMe
		}
		if set["log-level"] {
			c.Log.Level = f.logLevel
		}
		if set["log-format"] {
			c.Log.Format = f.logFormat
		}
		if set["metrics-listen"] {
			c.Metrics.Listen = f.metrics
		}
	})
	if err != nil {
		// Point at the flag when a flag supplied the bad value.
		var fes []*FieldError
		collectFieldErrors(err, &fes)
		for _, fe := range fes {
			for name, field := range flagFields {
				if field == fe.Field && set[name] {
					fe.Flag = name
				}
			}
		}
		return Config{}, err
	}
	return c, nil
}

func collectFieldErrors(err error, out *[]*FieldError) {
	if fe, ok := err.(*FieldError); ok {
		*out = append(*out, fe)
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			collectFieldErrors(e, out)
		}
	}
}

// LoadFromArgs is cmd/kvtierd's entry: args are os.Args[1:]. It returns
// flag.ErrHelp for -h/-help (usage already printed to stderr).
func LoadFromArgs(args []string) (Config, error) { return loadFromArgs(systemEnv(), args, os.Stderr) }

func loadFromArgs(e env, args []string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("kvtierd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return f.load(e)
}

// parseMemInfo reads MemTotal and MemAvailable (in bytes) from the
// /proc/meminfo format. Kernels before 3.14 lack MemAvailable; MemFree is
// the conservative stand-in.
func parseMemInfo(r io.Reader) (memInfo, error) {
	var m memInfo
	var free uint64
	var haveTotal, haveAvail bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			v *= KiB
		}
		switch name {
		case "MemTotal":
			m.Total, haveTotal = v, true
		case "MemAvailable":
			m.Available, haveAvail = v, true
		case "MemFree":
			free = v
		}
	}
	if err := sc.Err(); err != nil {
		return memInfo{}, err
	}
	if !haveTotal {
		return memInfo{}, errors.New("meminfo: no MemTotal")
	}
	if !haveAvail {
		m.Available = free
	}
	return m, nil
}
