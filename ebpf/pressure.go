package ebpf

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// PressureSource is the host memory pressure signal the Controller reads
// once per interval.
type PressureSource interface {
	// Name is "vmscan" or "psi" (status and metrics report it).
	Name() string
	// Pressure returns the share of the last interval, in percent
	// (0..100), during which tasks stalled on memory.
	Pressure(interval time.Duration) (float64, error)
}

// PSI reads a pressure file (/proc/pressure/memory, or a cgroup's
// memory.pressure) and reports the "some" stall share over each interval,
// from the total stall time (not avg10, which lags by design).
type PSI struct {
	Path string

	mu        sync.Mutex
	lastTotal uint64
	primed    bool
}

// DefaultPSIPath is the host's memory pressure file.
const DefaultPSIPath = "/proc/pressure/memory"

// Name implements PressureSource.
func (p *PSI) Name() string { return "psi" }

// Pressure implements PressureSource.
func (p *PSI) Pressure(interval time.Duration) (float64, error) {
	s, err := ReadPSI(p.Path)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	last, primed := p.lastTotal, p.primed
	p.lastTotal, p.primed = s.SomeTotal, true
	if !primed || interval <= 0 {
		return s.SomeAvg10, nil
	}
	if s.SomeTotal < last {
		// Not the counter read last time (another file behind the path):
		// the delta counts from this sample.
		return 0, nil
	}
	return math.Min(100, 100*float64(time.Duration(s.SomeTotal-last)*time.Microsecond)/float64(interval)), nil
}

// PSISample is the "some" line of a pressure file.
type PSISample struct {
	SomeAvg10 float64 // percent
	SomeTotal uint64  // µs stalled since boot
}

// ReadPSI parses the "some" line of a PSI file.
func ReadPSI(path string) (PSISample, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return PSISample{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "some" {
			continue
		}
		var s PSISample
		seen := 0
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "avg10":
				s.SomeAvg10, err = strconv.ParseFloat(v, 64)
				seen++
			case "total":
				s.SomeTotal, err = strconv.ParseUint(v, 10, 64)
				seen++
			}
			if err != nil {
				return PSISample{}, fmt.Errorf("%s: %q: %w", path, kv, err)
			}
		}
		if seen == 2 {
			// A share of time, or the file is not what it says (NaN or
			// Inf would also break the status's JSON).
			if !(s.SomeAvg10 >= 0 && s.SomeAvg10 <= 100) {
				return PSISample{}, fmt.Errorf("%s: some avg10=%v is not a percentage", path, s.SomeAvg10)
			}
			return s, nil
		}
	}
	return PSISample{}, fmt.Errorf("%s: no \"some\" line with avg10 and total", path)
}

// ReclaimCounter is what a vmscan source reads (*ReclaimProbe, or a fake).
type ReclaimCounter interface {
	Read() (ReclaimStats, error)
}

// ReclaimSource turns direct-reclaim stall time into a pressure share.
type ReclaimSource struct {
	Probe ReclaimCounter

	mu     sync.Mutex
	last   ReclaimStats
	primed bool
}

// Name implements PressureSource.
func (r *ReclaimSource) Name() string { return "vmscan" }

// Pressure implements PressureSource: stall time per wall time over the
// interval (stalls of several tasks add up; capped at 100).
func (r *ReclaimSource) Pressure(interval time.Duration) (float64, error) {
	s, err := r.Probe.Read()
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	last, primed := r.last, r.primed
	r.last, r.primed = s, true
	if !primed || interval <= 0 {
		return 0, nil
	}
	return math.Min(100, 100*float64(s.StallTime-last.StallTime)/float64(interval)), nil
}

// Watermarker is the host tier's mover thresholds (*tiers.Chain). The
// chain owns the effective watermarks (configured × capacity ratio ×
// pressure ratio); the controller only sets its own ratio.
type Watermarker interface {
	Watermarks() (high, low float64) // effective
	SetPressureRatio(r float64) error
}

// ControllerConfig tunes the Controller; zero fields take the defaults.
type ControllerConfig struct {
	Interval time.Duration // between samples (1s)
	High     float64       // pressure (%) at or above which the target shrinks (10)
	Low      float64       // pressure (%) at or below which it counts as calm (2)
	Calm     int           // calm samples in a row before the target grows (5)
	Step     float64       // ratio change per decision (0.1)
	Min      float64       // smallest target ratio (0.25)
}

func (c *ControllerConfig) defaults() {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.High <= 0 {
		c.High = 10
	}
	if c.Low <= 0 || c.Low >= c.High {
		c.Low = min(2, c.High/2)
	}
	if c.Calm <= 0 {
		c.Calm = 5
	}
	if c.Step <= 0 || c.Step > 1 {
		c.Step = 0.1
	}
	if c.Min <= 0 || c.Min > 1 {
		c.Min = 0.25
	}
}

// ControllerState is what status and metrics show.
type ControllerState struct {
	Source      string  // the PressureSource's name
	Pressure    float64 // last sample, percent
	SomeAvg10   float64 // the host's PSI some avg10, when readable (else -1)
	TargetRatio float64 // 1: full host tier; lower: watermarks scaled down
	Shrinks     uint64  // decisions that lowered the target
	Grows       uint64  // decisions that raised it
}

// Controller shrinks the host tier's target under memory pressure and lets
// it grow back when the pressure is gone: on a sample at or above High the
// watermarks drop by Step (times the configured ones), down to Min; after
// Calm samples in a row at or below Low they rise by Step, up to the
// configured ones. Samples in between hold the target (hysteresis).
// Lowering the high watermark makes the tier's demoter move the coldest
// blocks to NVMe.
//
// The controller sets only its ratio (Watermarker.SetPressureRatio); the
// chain multiplies it with the configured watermarks and the host capacity
// target, so a reload (SIGHUP) of either takes effect at once, under
// pressure too, and stays scaled by the pressure target.
type Controller struct {
	cfg ControllerConfig
	src PressureSource
	wm  Watermarker
	log *slog.Logger
	psi string // host PSI file for SomeAvg10 ("" none)

	mu        sync.Mutex
	st        ControllerState
	calmCount int
	// last is when the source last read successfully: a sample covers the
	// time since, which is the interval only when the tick was on time.
	last time.Time
}

// NewController returns a controller of wm driven by src. psiPath, if not
// "", is read for status (SomeAvg10) whatever the source.
func NewController(cfg ControllerConfig, src PressureSource, wm Watermarker, psiPath string, log *slog.Logger) *Controller {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{cfg: cfg, src: src, wm: wm, log: log, psi: psiPath}
	c.st = ControllerState{Source: src.Name(), TargetRatio: 1, SomeAvg10: -1}
	return c
}

// State returns the controller's state.
func (c *Controller) State() ControllerState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

// Run samples every interval until ctx ends, then sets the pressure ratio
// back to 1.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	c.sample() // prime the deltas
	for {
		select {
		case <-ctx.Done():
			c.mu.Lock()
			if c.st.TargetRatio < 1 && c.wm.SetPressureRatio(1) == nil {
				c.st.TargetRatio = 1 // status and metrics show it while the daemon drains
			}
			c.mu.Unlock()
			return
		case <-t.C:
			c.Step()
		}
	}
}

// sample reads the source over the time since its last good read (the
// interval for the first): a tick delivered late, when the daemon was
// stalled (under memory pressure, typically), covers more stall time than
// one interval holds, and would read as more pressure than there was.
func (c *Controller) sample() (float64, error) {
	now := time.Now()
	c.mu.Lock()
	interval := c.cfg.Interval
	if !c.last.IsZero() {
		interval = now.Sub(c.last)
	}
	c.mu.Unlock()
	p, err := c.src.Pressure(interval)
	if err == nil {
		c.mu.Lock()
		c.last = now
		c.mu.Unlock()
	}
	return p, err
}

// Step takes one sample and decides (Run calls it; tests may directly).
func (c *Controller) Step() {
	p, err := c.sample()
	avg := -1.0
	if c.psi != "" {
		if s, perr := ReadPSI(c.psi); perr == nil {
			avg = s.SomeAvg10
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.SomeAvg10 = avg
	if err != nil {
		c.log.Debug("memory pressure sample failed", "source", c.src.Name(), "err", err)
		return
	}
	c.st.Pressure = p
	next := c.st.TargetRatio
	switch {
	case p >= c.cfg.High:
		c.calmCount = 0
		next = math.Max(c.cfg.Min, next-c.cfg.Step)
	case p <= c.cfg.Low:
		c.calmCount++
		if c.calmCount >= c.cfg.Calm && next < 1 {
			c.calmCount = 0
			next = math.Min(1, next+c.cfg.Step)
		}
	default:
		c.calmCount = 0
	}
	if next == c.st.TargetRatio {
		return
	}
	// Round away float drift so that the full target is exactly 1.
	next = math.Round(next*1000) / 1000
	if err := c.wm.SetPressureRatio(next); err != nil {
		c.log.Warn("cannot set host tier pressure ratio", "ratio", next, "err", err)
		return
	}
	high, _ := c.wm.Watermarks()
	if next < c.st.TargetRatio {
		c.st.Shrinks++
		c.log.Info("memory pressure: shrinking the host tier", "source", c.src.Name(), "pressure_pct", p,
			"target_ratio", next, "high_watermark", high)
	} else {
		c.st.Grows++
		c.log.Info("memory pressure eased: growing the host tier back", "source", c.src.Name(), "pressure_pct", p,
			"target_ratio", next, "high_watermark", high)
	}
	c.st.TargetRatio = next
}
