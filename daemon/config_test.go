package daemon

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func fakeEnv(euid int, vars map[string]string, mem memInfo) env {
	return env{
		Getenv:  func(k string) string { return vars[k] },
		Euid:    func() int { return euid },
		MemInfo: func() (memInfo, error) { return mem, nil },
	}
}

var bigMem = memInfo{Total: 512 * GiB, Available: 400 * GiB}

func writeTOML(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kvtierd.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigDefaults(t *testing.T) {
	tests := []struct {
		name                   string
		euid                   int
		vars                   map[string]string
		runtime, state, socket string
		uids                   []uint32
	}{
		{"root", 0, map[string]string{"XDG_RUNTIME_DIR": "/run/user/0", "HOME": "/root"},
			"/run/kvtier", "/var/lib/kvtier", "/run/kvtier/kvtierd.sock", []uint32{0}},
		{"user xdg", 1000, map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000", "XDG_STATE_HOME": "/home/u/.st", "HOME": "/home/u"},
			"/run/user/1000/kvtier", "/home/u/.st/kvtier", "/run/user/1000/kvtier/kvtierd.sock", []uint32{1000, 0}},
		{"user no xdg", 1000, map[string]string{"HOME": "/home/u"},
			"/tmp/kvtier-1000", "/home/u/.local/state/kvtier", "/tmp/kvtier-1000/kvtierd.sock", []uint32{1000, 0}},
		{"user relative xdg ignored", 1001, map[string]string{"XDG_RUNTIME_DIR": "rel", "XDG_STATE_HOME": "rel", "HOME": "/h"},
			"/tmp/kvtier-1001", "/h/.local/state/kvtier", "/tmp/kvtier-1001/kvtierd.sock", []uint32{1001, 0}},
		{"user no home", 1002, nil,
			"/tmp/kvtier-1002", "/tmp/kvtier-1002/state", "/tmp/kvtier-1002/kvtierd.sock", []uint32{1002, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := fakeEnv(tt.euid, tt.vars, bigMem).load("", nil)
			if err != nil {
				t.Fatal(err)
			}
			if c.RuntimeDir != tt.runtime || c.StateDir != tt.state || c.Socket != tt.socket {
				t.Errorf("dirs = %q %q %q, want %q %q %q", c.RuntimeDir, c.StateDir, c.Socket, tt.runtime, tt.state, tt.socket)
			}
			if !reflect.DeepEqual(c.Auth.UIDs, tt.uids) || len(c.Auth.GIDs) != 0 {
				t.Errorf("auth = %+v, want uids %v", c.Auth, tt.uids)
			}
			want := Config{
				RuntimeDir: tt.runtime, StateDir: tt.state, Socket: tt.socket,
				Log:  LogConfig{Level: "info", Format: "text"},
				Auth: AuthConfig{UIDs: tt.uids},
				Host: HostConfig{Capacity: 64 * GiB, SlabBytes: 64 * MiB, Prefault: true,
					HighWatermark: 0.95, LowWatermark: 0.85, Policy: "density", CapacityAuto: true},
				Session: SessionConfig{RingEntries: 1024, DataBytes: MiB, MaxSessions: 1024, MaxAdmin: 64, SpinMicros: 200},
				NVMe:    NVMeConfig{Enabled: true, FlushOnStop: true, StopBudgetSeconds: 75, ParkTTLSeconds: 3600, ParkedShare: 0.5},
				Metrics: MetricsConfig{Listen: "127.0.0.1:9477"},
				EBPF:    EBPFConfig{Enabled: true},
				GPU:     GPUConfig{Enabled: true, ArenaFraction: 0.5, HighWatermark: 0.9, LowWatermark: 0.8},
			}
			if !reflect.DeepEqual(c, want) {
				t.Errorf("got  %+v\nwant %+v", c, want)
			}
		})
	}
}

func TestConfigAutoCapacity(t *testing.T) {
	tests := []struct {
		name string
		mem  memInfo
		err  error
		slab ByteSize
		want ByteSize
	}{
		{"capped at 64GiB", bigMem, nil, 64 * MiB, 64 * GiB},
		{"quarter of total", memInfo{Total: 16 * GiB, Available: 15 * GiB}, nil, 64 * MiB, 4 * GiB},
		{"half of available", memInfo{Total: 16 * GiB, Available: 2 * GiB}, nil, 64 * MiB, 1 * GiB},
		{"rounded down to slab", memInfo{Total: 16 * GiB, Available: 2*GiB + 260*MiB}, nil, 64 * MiB, GiB + 128*MiB},
		{"at least two slabs", memInfo{Total: 256 * MiB, Available: 10 * MiB}, nil, 64 * MiB, 128 * MiB},
		{"follows slab size", memInfo{Total: 10 * GiB, Available: 10 * GiB}, nil, GiB, 2 * GiB},
		{"meminfo error falls back", memInfo{}, errors.New("no proc"), 64 * MiB, 1 * GiB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := autoCapacity(func() (memInfo, error) { return tt.mem, tt.err }, tt.slab)
			if got != tt.want {
				t.Errorf("autoCapacity = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestConfigFileOverrides(t *testing.T) {
	p := writeTOML(t, `
runtime_dir = "/srv/run"
state_dir = "/srv/state"
[log]
level = "debug"
format = "json"
[auth]
uids = [42]
gids = [7, 8]
[host]
slab_bytes = "1GiB"
hugepages = true
prefault = false
[session]
ring_entries = 4096
data_bytes = 65536
max_sessions = 8
max_admin = 4
spin_us = 0
[nvme]
enabled = false
capacity = "1GiB"
`)
	c, err := fakeEnv(1000, nil, bigMem).load(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		RuntimeDir: "/srv/run", StateDir: "/srv/state",
		Socket: "/srv/run/kvtierd.sock", // derived from the file's runtime_dir
		Log:    LogConfig{Level: "debug", Format: "json"},
		Auth:   AuthConfig{UIDs: []uint32{42}, GIDs: []uint32{7, 8}},
		// Capacity derived with the file's slab size: 64GiB is a multiple of 1GiB.
		Host: HostConfig{Capacity: 64 * GiB, SlabBytes: GiB, HugePages: true, Prefault: false,
			HighWatermark: 0.95, LowWatermark: 0.85, Policy: "density", CapacityAuto: true},
		Session: SessionConfig{RingEntries: 4096, DataBytes: 64 * KiB, MaxSessions: 8, MaxAdmin: 4, SpinMicros: 0},
		NVMe:    NVMeConfig{Enabled: false, Capacity: GiB, FlushOnStop: true, StopBudgetSeconds: 75, ParkTTLSeconds: 3600, ParkedShare: 0.5},
		Metrics: MetricsConfig{Listen: "127.0.0.1:9477"},
		EBPF:    EBPFConfig{Enabled: true},
		GPU:     GPUConfig{Enabled: true, ArenaFraction: 0.5, HighWatermark: 0.9, LowWatermark: 0.8},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
}

func TestConfigUnknownKey(t *testing.T) {
	for _, tt := range []struct{ body, key string }{
		{"sokcet = \"/x\"\n", "sokcet"},
		{"[host]\ncapacty = \"4GiB\"\n", "host.capacty"},
		{"[nvme]\npath = \"/x\"\n", "nvme"},
	} {
		_, err := fakeEnv(1000, nil, bigMem).load(writeTOML(t, tt.body), nil)
		if err == nil || !strings.Contains(err.Error(), "unknown key") || !strings.Contains(err.Error(), tt.key) {
			t.Errorf("%q: err = %v, want unknown key naming %s", tt.body, err, tt.key)
		}
	}
}

func TestConfigBadFile(t *testing.T) {
	e := fakeEnv(1000, nil, bigMem)
	if _, err := e.load(filepath.Join(t.TempDir(), "missing.toml"), nil); err == nil {
		t.Error("missing file: no error")
	}
	_, err := e.load(writeTOML(t, "[host\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "line") {
		t.Errorf("syntax error: err = %v, want position", err)
	}
	_, err = e.load(writeTOML(t, "[session]\nring_entries = \"many\"\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "ring_entries") {
		t.Errorf("type error: err = %v, want field name", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		mut   func(*Config)
		field string // "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"relative runtime_dir", func(c *Config) { c.RuntimeDir = "run" }, "runtime_dir"},
		{"empty state_dir", func(c *Config) { c.StateDir = "" }, "state_dir"},
		{"relative socket", func(c *Config) { c.Socket = "s.sock" }, "socket"},
		{"socket too long", func(c *Config) { c.Socket = "/" + strings.Repeat("a", 107) }, "socket"},
		{"socket max len", func(c *Config) { c.Socket = "/" + strings.Repeat("a", 106) }, ""},
		{"log level", func(c *Config) { c.Log.Level = "verbose" }, "log.level"},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format"},
		{"no auth", func(c *Config) { c.Auth = AuthConfig{} }, "auth.uids"},
		{"gids only", func(c *Config) { c.Auth = AuthConfig{GIDs: []uint32{5}} }, ""},
		{"slab not pow2", func(c *Config) { c.Host.SlabBytes = 3000000 }, "host.slab_bytes"},
		{"slab too small", func(c *Config) { c.Host.SlabBytes = 512 * KiB; c.Host.Capacity = 2 * MiB }, "host.slab_bytes"},
		{"slab too big", func(c *Config) { c.Host.SlabBytes = 2 * GiB; c.Host.Capacity = 4 * GiB }, "host.slab_bytes"},
		{"slab 1MiB", func(c *Config) { c.Host.SlabBytes = MiB; c.Host.Capacity = 2 * MiB }, ""},
		{"capacity not multiple", func(c *Config) { c.Host.Capacity = 100 * MiB }, "host.capacity"},
		{"capacity one slab", func(c *Config) { c.Host.Capacity = 64 * MiB }, "host.capacity"},
		{"ring too small", func(c *Config) { c.Session.RingEntries = 32 }, "session.ring_entries"},
		{"ring too big", func(c *Config) { c.Session.RingEntries = 131072 }, "session.ring_entries"},
		{"ring not pow2", func(c *Config) { c.Session.RingEntries = 1000 }, "session.ring_entries"},
		{"ring bounds ok", func(c *Config) { c.Session.RingEntries = 65536 }, ""},
		{"data too small", func(c *Config) { c.Session.DataBytes = 64*KiB - 1 }, "session.data_bytes"},
		{"data too big", func(c *Config) { c.Session.DataBytes = 64*MiB + 1 }, "session.data_bytes"},
		{"max sessions", func(c *Config) { c.Session.MaxSessions = 0 }, "session.max_sessions"},
		{"max admin zero", func(c *Config) { c.Session.MaxAdmin = 0 }, "session.max_admin"},
		{"max admin too many", func(c *Config) { c.Session.MaxAdmin = 65537 }, "session.max_admin"},
		{"max admin bound ok", func(c *Config) { c.Session.MaxAdmin = 65536 }, ""},
		{"spin negative", func(c *Config) { c.Session.SpinMicros = -1 }, "session.spin_us"},
		{"spin too long", func(c *Config) { c.Session.SpinMicros = 10001 }, "session.spin_us"},
		// Past int64 or time.Duration: used to pass, then wrap (a negative
		// capacity, a park TTL of 290 ms).
		{"capacity past int64", func(c *Config) { c.Host.Capacity = 1 << 63 }, "host.capacity"},
		{"nvme capacity past int64", func(c *Config) { c.NVMe.Capacity = 1 << 63 }, "nvme.capacity"},
		{"park ttl past Duration", func(c *Config) { c.NVMe.ParkTTLSeconds = 18446744074 }, "nvme.park_ttl_s"},
		{"park ttl at Duration's bound", func(c *Config) { c.NVMe.ParkTTLSeconds = 9223372036 }, ""},
		// A GPU arena under one slab used to pass, and the GPU tier was
		// then switched off at start with a log line instead of a refusal.
		{"gpu arena under a host slab", func(c *Config) { c.GPU.ArenaBytes = 16 * MiB }, "gpu.arena_bytes"},
		{"gpu arena under a gpu slab", func(c *Config) { c.GPU.SlabBytes = 4 * MiB; c.GPU.ArenaBytes = 3 * MiB }, "gpu.arena_bytes"},
		{"gpu arena one gpu slab", func(c *Config) { c.GPU.SlabBytes = 4 * MiB; c.GPU.ArenaBytes = 4 * MiB }, ""},
		{"gpu arena one host slab", func(c *Config) { c.GPU.ArenaBytes = 64 * MiB }, ""},
		{"gpu arena past int64", func(c *Config) { c.GPU.ArenaBytes = 1 << 63 }, "gpu.arena_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := fakeEnv(1000, map[string]string{"HOME": "/h"}, bigMem).load("", nil)
			if err != nil {
				t.Fatal(err)
			}
			tt.mut(&c)
			err = c.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one naming %s", tt.field)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !strings.HasPrefix(err.Error(), tt.field+": ") {
				t.Errorf("err = %v, want field %s", err, tt.field)
			}
		})
	}
}

func TestConfigValidateMessage(t *testing.T) {
	c, _ := fakeEnv(1000, nil, bigMem).load("", nil)
	c.Host.SlabBytes = 3000000
	want := "host.slab_bytes: must be a power of two between 1MiB and 1GiB, got 3000000"
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
}

func TestByteSize(t *testing.T) {
	tests := []struct {
		toml string
		want ByteSize
		bad  bool
	}{
		{`v = "4GiB"`, 4 * GiB, false},
		{`v = "512MB"`, 512_000_000, false},
		{`v = "64 MiB"`, 64 * MiB, false},
		{`v = "1048576"`, MiB, false},
		{`v = 1048576`, MiB, false},
		{`v = 0`, 0, false},
		{`v = "bogus"`, 0, true},
		{`v = ""`, 0, true},
		{`v = -1`, 0, true},
		{`v = 1.5`, 0, true},
		{`v = true`, 0, true},
	}
	for _, tt := range tests {
		var dst struct{ V ByteSize }
		_, err := toml.Decode(tt.toml, &dst)
		if tt.bad {
			if err == nil {
				t.Errorf("%s: no error, got %v", tt.toml, dst.V)
			}
			continue
		}
		if err != nil || dst.V != tt.want {
			t.Errorf("%s: got %v, %v; want %v", tt.toml, dst.V, err, tt.want)
		}
	}
	for _, b := range []ByteSize{0, 1, 1000, KiB, 3 * MiB, 64 * GiB, 3000000, GiB + KiB} {
		var back ByteSize
		if err := back.UnmarshalText([]byte(b.String())); err != nil || back != b {
			t.Errorf("%d: String %q round-trips to %v, %v", uint64(b), b.String(), back, err)
		}
	}
	if s := ByteSize(64 * MiB).String(); s != "64MiB" {
		t.Errorf("String = %q", s)
	}
}

func TestConfigFlags(t *testing.T) {
	file := writeTOML(t, `
runtime_dir = "/file/run"
state_dir = "/file/state"
[log]
level = "debug"
[host]
capacity = "8GiB"
`)
	e := fakeEnv(1000, map[string]string{"HOME": "/h"}, bigMem)
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, c Config)
		err   string
	}{
		{"file only", []string{"-config", file}, func(t *testing.T, c Config) {
			if c.RuntimeDir != "/file/run" || c.Socket != "/file/run/kvtierd.sock" || c.Log.Level != "debug" || c.Host.Capacity != 8*GiB {
				t.Errorf("%+v", c)
			}
		}, ""},
		{"flags over file", []string{"-config", file, "-runtime-dir", "/flag/run", "-host-capacity", "2GiB", "-log-format", "json"}, func(t *testing.T, c Config) {
			// The socket follows the flag's runtime dir; unset flags keep file values.
			if c.RuntimeDir != "/flag/run" || c.Socket != "/flag/run/kvtierd.sock" || c.Host.Capacity != 2*GiB ||
				c.Log.Format != "json" || c.Log.Level != "debug" || c.StateDir != "/file/state" {
				t.Errorf("%+v", c)
			}
		}, ""},
		{"explicit socket", []string{"-runtime-dir", "/r", "-socket", "/s/k.sock", "-state-dir", "/st", "-log-level", "warn"}, func(t *testing.T, c Config) {
			if c.RuntimeDir != "/r" || c.Socket != "/s/k.sock" || c.StateDir != "/st" || c.Log.Level != "warn" {
				t.Errorf("%+v", c)
			}
		}, ""},
		{"no args", nil, func(t *testing.T, c Config) {
			if c.RuntimeDir != "/tmp/kvtier-1000" || c.Host.Capacity != 64*GiB {
				t.Errorf("%+v", c)
			}
		}, ""},
		{"bad capacity value", []string{"-host-capacity", "bogus"}, nil, "-host-capacity"},
		{"invalid capacity names flag", []string{"-host-capacity", "100MiB"}, nil, "host.capacity (flag -host-capacity)"},
		{"invalid level names flag", []string{"-config", file, "-log-level", "loud"}, nil, "log.level (flag -log-level)"},
		{"unknown flag", []string{"-nope"}, nil, "-nope"},
		{"positional", []string{"extra"}, nil, `unexpected argument "extra"`},
		{"help", []string{"-h"}, nil, flag.ErrHelp.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadFromArgs(e, tt.args, io.Discard)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestAuthAllowed(t *testing.T) {
	a := AuthConfig{UIDs: []uint32{1000}, GIDs: []uint32{50}}
	for _, tt := range []struct {
		uid, gid uint32
		ok       bool
	}{{1000, 1, true}, {7, 50, true}, {7, 1, false}} {
		if a.Allowed(tt.uid, tt.gid) != tt.ok {
			t.Errorf("Allowed(%d,%d) != %v", tt.uid, tt.gid, tt.ok)
		}
	}
}

func TestParseMemInfo(t *testing.T) {
	m, err := parseMemInfo(strings.NewReader("MemTotal:       16318740 kB\nMemFree:         1000 kB\nMemAvailable:   8000000 kB\nHugePages_Total:       0\n"))
	if err != nil || m.Total != 16318740*KiB || m.Available != 8000000*KiB {
		t.Errorf("got %+v, %v", m, err)
	}
	m, err = parseMemInfo(strings.NewReader("MemTotal: 2048 kB\nMemFree: 1024 kB\n"))
	if err != nil || m.Available != 1024*KiB {
		t.Errorf("no MemAvailable: got %+v, %v", m, err)
	}
	if _, err := parseMemInfo(strings.NewReader("garbage\n")); err == nil {
		t.Error("no MemTotal: want error")
	}
}

func TestNewLogger(t *testing.T) {
	var sb strings.Builder
	LogConfig{Level: "warn", Format: "json"}.NewLogger(&sb).Info("hidden")
	LogConfig{Level: "warn", Format: "json"}.NewLogger(&sb).Warn("shown")
	if s := sb.String(); strings.Contains(s, "hidden") || !strings.Contains(s, `"msg":"shown"`) {
		t.Errorf("log output %q", s)
	}
}

func TestConfigTieringValidation(t *testing.T) {
	tests := []struct {
		name, toml, field string
	}{
		{"unknown policy", "[host]\npolicy = \"mru\"\n", "host.policy"},
		{"high watermark above 1", "[host]\nhigh_watermark = 1.5\n", "host.high_watermark"},
		{"low not below high", "[host]\nhigh_watermark = 0.8\nlow_watermark = 0.8\n", "host.low_watermark"},
		{"tiny nvme budget", "[nvme]\ncapacity = \"1MiB\"\n", "nvme.capacity"},
		{"park ttl zero", "[nvme]\npark_ttl_s = 0\n", "nvme.park_ttl_s"},
		{"parked share zero", "[nvme]\nparked_share = 0.0\n", "nvme.parked_share"},
		{"parked share above 1", "[nvme]\nparked_share = 1.5\n", "nvme.parked_share"},
		{"parked share NaN", "[nvme]\nparked_share = nan\n", "nvme.parked_share"},
		{"stop budget zero", "[nvme]\nstop_budget_s = 0\n", "nvme.stop_budget_s"},
		{"stop budget past an hour", "[nvme]\nstop_budget_s = 3601\n", "nvme.stop_budget_s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := fakeEnv(1000, nil, bigMem).load(writeTOML(t, tt.toml), nil)
			if err == nil || !strings.Contains(err.Error(), tt.field+":") {
				t.Fatalf("err = %v, want one naming %s", err, tt.field)
			}
		})
	}
	for _, name := range []string{"lru", "chain", "density"} {
		if _, err := fakeEnv(1000, nil, bigMem).load(writeTOML(t, "[host]\npolicy = \""+name+"\"\n"), nil); err != nil {
			t.Errorf("policy %s refused: %v", name, err)
		}
	}
}

// TestConfigCapacityOverMemory: an explicit host.capacity larger than the
// machine's memory (or the cgroup's limit) is refused at start with the
// field named: the arena could never be backed, and the background prefault
// (on by default) faulted it in until the OOM killer ended kvtierd, which
// systemd then restarted into the same end. A reload is not refused: there a
// capacity above the arena is capped at it.
func TestConfigCapacityOverMemory(t *testing.T) {
	mem := memInfo{Total: 16 * GiB, Available: 12 * GiB}
	big := writeTOML(t, "[host]\ncapacity = \"32GiB\"\n")
	for _, tt := range []struct {
		name   string
		args   []string
		reload bool
		err    string
	}{
		{"flag", []string{"-host-capacity", "1TiB"}, false, "host.capacity (flag -host-capacity)"},
		{"file", []string{"-config", big}, false, "host.capacity"},
		{"within memory", []string{"-host-capacity", "8GiB"}, false, ""},
		{"reload", []string{"-config", big}, true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := fakeEnv(0, nil, mem)
			if tt.reload {
				e.HostCapacity, e.HostSlab = 8*GiB, defaultSlabBytes
			}
			_, err := loadFromArgs(e, tt.args, io.Discard)
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("err = %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), "memory")):
				t.Fatalf("err = %v, want a refusal naming %q and the memory", err, tt.err)
			}
		})
	}
}
