package daemon

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	sdnotify "github.com/coreos/go-systemd/v22/daemon"
)

// reloadState is the part of the daemon a configuration reload changes.
// d.cfg stays the configuration the daemon started with (read without
// locks everywhere); cur is the configuration in effect: d.cfg with the
// live fields of every accepted reload applied.
type reloadState struct {
	mu     sync.Mutex // serializes Reload
	cur    Config
	loaded bool // cur is set (else it is d.cfg)
	// hostTarget is cur.Host.Capacity, readable without mu (status and
	// metrics must not wait for a reload that evicts): the host tier's
	// capacity in effect, 0 before any reload (the arena).
	hostTarget atomic.Int64
}

// hostCapacity is the host tier's capacity in effect: the arena, or the
// smaller host.capacity target of a reload.
func (d *Daemon) hostCapacity(arena int64) int64 {
	if t := d.reload.hostTarget.Load(); t > 0 && t < arena {
		return t
	}
	return arena
}

// liveFields are the configuration fields Reload applies to a running
// daemon, by dotted TOML name. Every other field needs a restart: the host
// arena is one sealed memfd mapped by every client (host.slab_bytes,
// hugepages), the socket and directories are what clients and the state
// lock are bound to, and the rest is read once at start.
//
// host.capacity is live as a target: the arena cannot shrink or grow, so a
// smaller capacity scales the mover's watermarks by capacity/arena (with
// the memory pressure ratio, tiers.Chain.SetCapacityRatio) and a larger
// one is capped at the arena (growing it needs a restart). nvme.capacity
// is live when the NVMe tier is on and the value is not 0 (auto): the
// store's budget changes and a smaller one evicts down to it (its segment
// file size stays the one computed at start).
var liveFields = []string{"log.level", "host.capacity", "host.high_watermark", "host.low_watermark", "nvme.capacity"}

// Config returns the configuration in effect: the one the daemon started
// with, plus the live fields of the reloads applied since.
func (d *Daemon) Config() Config {
	d.reload.mu.Lock()
	defer d.reload.mu.Unlock()
	return d.currentLocked()
}

func (d *Daemon) currentLocked() Config {
	if d.reload.loaded {
		return d.reload.cur
	}
	return d.cfg
}

// Reload applies next (typically the config file read again on SIGHUP) to
// the running daemon without dropping sessions: the log level, the host
// tier's watermarks and capacity target and the NVMe tier's capacity
// change at once (see liveFields). Fields that can only change with a
// restart are named in one warning and otherwise ignored, so the next
// reload names them again until the daemon restarts. An invalid next is
// refused as a whole. systemd sees RELOADING=1 … READY=1 around it.
func (d *Daemon) Reload(next Config) error {
	d.reload.mu.Lock()
	defer d.reload.mu.Unlock()
	if d.closing.Load() {
		return errors.New("reload: kvtierd is stopping")
	}
	d.notifyServing(sdnotify.SdNotifyReloading + "\n" + sdnotify.SdNotifyMonotonicUsec())
	defer func() { d.notifyServing(sdnotify.SdNotifyReady + "\nSTATUS=" + d.statusLine(false)) }()
	// host.slab_bytes needs a restart: a capacity target is a whole
	// number of the running arena's slabs.
	if err := next.validate(d.cfg.Host.SlabBytes); err != nil {
		d.log.Error("configuration reload refused; keeping the running configuration", "err", err)
		return fmt.Errorf("reload: %w", err)
	}
	cur := d.currentLocked()
	var applied, ignored []string
	for _, f := range diffConfig(cur, next) {
		if slices.Contains(liveFields, f) {
			applied = append(applied, f)
		} else {
			ignored = append(ignored, f)
		}
	}
	notLive := func(f string) {
		applied = slices.DeleteFunc(applied, func(a string) bool { return a == f })
		ignored = append(ignored, f)
	}
	// The NVMe budget first: the one change that can fail, and then the
	// reload is refused before anything else changed.
	if slices.Contains(applied, "nvme.capacity") {
		if d.nvme == nil || next.NVMe.Capacity == 0 {
			notLive("nvme.capacity") // tier off, or auto-sized at start
		} else if err := d.nvme.SetCapacity(int64(next.NVMe.Capacity)); err != nil {
			d.log.Error("configuration reload refused; keeping the running configuration", "err", err)
			return fmt.Errorf("reload: %w", err)
		} else {
			cur.NVMe.Capacity = next.NVMe.Capacity
		}
	}
	if slices.Contains(applied, "host.capacity") {
		_, arena := d.host.Usage()
		target := min(int64(next.Host.Capacity), arena)
		if int64(next.Host.Capacity) > arena {
			d.log.Warn("host.capacity is larger than the host arena; capped at the arena size, growing the arena needs a restart",
				"host_capacity", next.Host.Capacity.String(), "arena", ByteSize(arena).String())
		}
		if ByteSize(target) == cur.Host.Capacity {
			notLive("host.capacity")
		} else if err := d.chain.SetCapacityRatio(float64(target) / float64(arena)); err != nil {
			return fmt.Errorf("reload: %w", err) // Validate keeps target > 0
		} else {
			cur.Host.Capacity = ByteSize(target)
			d.reload.hostTarget.Store(target)
		}
	}
	if slices.Contains(applied, "log.level") {
		lv := levelVarOf(d.log)
		if lv == nil {
			// Only loggers built by LogConfig.NewLogger have a level to set.
			notLive("log.level")
		} else {
			lvl, _ := parseLevel(next.Log.Level) // validated
			lv.Set(lvl)
			cur.Log.Level = next.Log.Level
		}
	}
	if cur.Host.HighWatermark != next.Host.HighWatermark || cur.Host.LowWatermark != next.Host.LowWatermark {
		if err := d.chain.SetWatermarks(next.Host.HighWatermark, next.Host.LowWatermark); err != nil {
			return fmt.Errorf("reload: %w", err) // Validate checks the same bounds
		}
		cur.Host.HighWatermark, cur.Host.LowWatermark = next.Host.HighWatermark, next.Host.LowWatermark
	}
	d.reload.cur, d.reload.loaded = cur, true
	if len(ignored) > 0 {
		d.log.Warn("configuration changes need a restart; ignored until then", "fields", strings.Join(ignored, ","))
	}
	d.log.Info("configuration reloaded", "applied", strings.Join(applied, ","),
		"log_level", cur.Log.Level, "high_watermark", cur.Host.HighWatermark, "low_watermark", cur.Host.LowWatermark,
		"host_capacity", cur.Host.Capacity.String(), "nvme_capacity", cur.NVMe.Capacity.String())
	return nil
}

// ReloadFromArgs reads the configuration again as kvtierd started with args
// (os.Args[1:]): defaults, the -config file as it is now, the same flags.
// An unset host.capacity keeps running's (sizing it from free memory again
// would count the daemon's own arena as used). See Daemon.ReloadFromArgs.
func ReloadFromArgs(args []string, running Config) (Config, error) {
	e := systemEnv()
	e.HostCapacity, e.HostSlab = running.Host.Capacity, running.Host.SlabBytes
	return loadFromArgs(e, args, io.Discard)
}

// diffConfig lists, by dotted TOML name, the fields whose values differ.
func diffConfig(a, b Config) []string {
	var out []string
	walkConfig(reflect.ValueOf(a), reflect.ValueOf(b), "", &out)
	return out
}

func walkConfig(a, b reflect.Value, prefix string, out *[]string) {
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		if prefix != "" {
			name = prefix + "." + name
		}
		fa, fb := a.Field(i), b.Field(i)
		if f.Type.Kind() == reflect.Struct {
			walkConfig(fa, fb, name, out)
			continue
		}
		if f.Type.Kind() == reflect.Slice && fa.Len() == 0 && fb.Len() == 0 {
			continue // nil and [] (an empty TOML array) mean the same
		}
		if !reflect.DeepEqual(fa.Interface(), fb.Interface()) {
			*out = append(*out, name)
		}
	}
}

// ReloadFromArgs is the package's ReloadFromArgs for this daemon: an unset
// (or 0) host.capacity means the running arena's size, so a reload without
// it undoes a smaller target an earlier reload set. (The target in effect,
// d.Config()'s, would keep that target until a restart.)
func (d *Daemon) ReloadFromArgs(args []string) (Config, error) {
	return ReloadFromArgs(args, d.cfg) // d.cfg.Host: the arena's capacity and slab
}
