package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/ebpf"
	"github.com/kvtier/kvtier/shm"
)

// The daemon's eBPF probes and the memory pressure controller. Each probe
// the kernel, the privileges or the configuration do not allow is logged
// once with its fallback:
//
//   - exit: a dead client's sessions end at its socket's EOF (which a
//     forked child holding the socket delays until it exits too);
//   - nvme_io: no latency histogram of the NVMe tier's disk;
//   - vmscan: the memory pressure controller reads PSI instead.

// ebpfEnv is where the probes look for the kernel's BTF (tests point it at
// missing paths to force the fallbacks).
var ebpfEnv ebpf.Env

// probes is owned by the Daemon: opened in New, served by Run, closed by
// closeResources.
type probes struct {
	exit   *ebpf.ExitTracer
	io     *ebpf.IOLatency
	vmscan *ebpf.ReclaimProbe
	ctl    *ebpf.Controller

	exits atomic.Uint64  // sessions stopped by an exit event
	wg    sync.WaitGroup // the exit event reader (ends at closeProbes)
	ctlWG sync.WaitGroup // the controller (ends at runProbes' stop)
}

// enabled reports which programs are loaded.
func (p *probes) enabled() map[string]bool {
	return map[string]bool{
		ebpf.ProgExit:   p != nil && p.exit != nil,
		ebpf.ProgNVMeIO: p != nil && p.io != nil,
		ebpf.ProgVmscan: p != nil && p.vmscan != nil,
	}
}

// openProbes loads what it can; failures are logged, never fatal.
func (d *Daemon) openProbes() {
	p := &probes{}
	d.probes = p
	unavailable := func(prog, fallback string, err error) {
		d.log.Warn("ebpf probe unavailable; using fallback", "program", prog, "fallback", fallback, "reason", err)
	}
	if !d.cfg.EBPF.Enabled {
		d.log.Info("ebpf probes disabled by configuration (ebpf.enabled=false); using fallbacks",
			"exit", "socket EOF", "nvme_io", "none", "vmscan", "PSI")
	} else {
		var err error
		if p.exit, err = ebpf.OpenExitTracer(ebpfEnv); err != nil {
			unavailable(ebpf.ProgExit, "socket EOF (a forked child holding the socket delays cleanup)", err)
		}
		if d.nvme == nil {
			d.log.Info("ebpf probe not needed: nvme tier off", "program", ebpf.ProgNVMeIO)
		} else if devs, derr := ebpf.DisksOf(filepath.Join(d.cfg.StateDir, "nvme")); derr != nil {
			unavailable(ebpf.ProgNVMeIO, "no nvme I/O latency histogram", derr)
		} else if p.io, err = ebpf.OpenIOLatency(ebpfEnv, devs); err != nil {
			unavailable(ebpf.ProgNVMeIO, "no nvme I/O latency histogram", err)
		} else {
			// The disks under a device-mapper, LVM or md volume, or the
			// one disk that holds the state dir; an NVMe multipath disk's
			// paths as "nvme0c1n1 (path of nvme0n1)".
			names := make([]string, len(devs))
			for i, dev := range devs {
				names[i] = dev.String()
			}
			d.log.Info("ebpf probe loaded", "program", ebpf.ProgNVMeIO, "disks", names)
		}
		if p.vmscan, err = ebpf.OpenReclaimProbe(ebpfEnv); err != nil {
			unavailable(ebpf.ProgVmscan, "PSI "+ebpf.DefaultPSIPath, err)
		}
		if p.exit != nil {
			d.log.Info("ebpf probe loaded", "program", ebpf.ProgExit)
		}
		if p.vmscan != nil {
			d.log.Info("ebpf probe loaded", "program", ebpf.ProgVmscan)
		}
	}
	var src ebpf.PressureSource
	psi := ebpf.DefaultPSIPath
	if _, err := ebpf.ReadPSI(psi); err != nil {
		psi = ""
	}
	switch {
	case p.vmscan != nil:
		src = &ebpf.ReclaimSource{Probe: p.vmscan}
	case psi != "":
		src = &ebpf.PSI{Path: psi}
	default:
		d.log.Warn("memory pressure controller off: neither eBPF vmscan nor PSI available", "psi", ebpf.DefaultPSIPath)
		return
	}
	p.ctl = ebpf.NewController(ebpf.ControllerConfig{}, src, d.chain, psi, d.log)
}

// runProbes starts the exit event reader and the pressure controller; the
// returned stop ends the controller and waits for it (the reader ends when
// closeProbes closes the tracer).
func (d *Daemon) runProbes(ctx context.Context) (stop func()) {
	p := d.probes
	if p == nil {
		return func() {}
	}
	if p.exit != nil {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			d.readExits(p.exit)
		}()
	}
	cctx, cancel := context.WithCancel(ctx)
	if p.ctl != nil {
		p.ctlWG.Add(1)
		go func() {
			defer p.ctlWG.Done()
			p.ctl.Run(cctx)
		}()
	}
	// The controller reads the vmscan probe: it is gone before
	// closeProbes closes that.
	return func() {
		cancel()
		p.ctlWG.Wait()
	}
}

// readExits stops the sessions of each client process that dies.
func (d *Daemon) readExits(t *ebpf.ExitTracer) {
	for {
		ev, err := t.Read()
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				d.log.Error("ebpf exit events stopped; dead clients are noticed at socket EOF", "err", err)
			}
			return
		}
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		d.clientExited(ev.Tgid, time.Duration(ts.Nano())-ev.At)
	}
}

// clientExited stops the sessions of process tgid, which died lag ago, and
// returns how many it stopped. The probe may report one death twice: with
// kill -9 the threads of a group exit concurrently, and two of them can both
// find the group's live count at zero when they reach the tracepoint. A
// session already stopping is therefore neither stopped nor counted again.
func (d *Daemon) clientExited(tgid uint32, lag time.Duration) int {
	var dead []*session
	d.mu.Lock()
	for _, s := range d.sessions {
		if s.pid == tgid && !s.stopped() {
			dead = append(dead, s)
		}
	}
	// Counted before the sessions stop: their slots may be free (and
	// observed) before stop even returns.
	n := len(dead)
	d.probes.exits.Add(uint64(n))
	for _, s := range dead {
		s.stop()
	}
	d.mu.Unlock()
	if n > 0 {
		d.peerLog.Info("client process exited; freeing its sessions", "pid", tgid, "sessions", n, "event_lag", lag)
	}
	return n
}

// watchClient adds an opened session's client pid to the exit filter.
func (d *Daemon) watchClient(s *session) {
	if d.probes == nil || d.probes.exit == nil || s.pid == 0 {
		return
	}
	if err := d.probes.exit.Add(s.pid); err != nil {
		s.log.Warn("client exit tracing off for this session; socket EOF only", "err", err)
		return
	}
	s.watched = true
	// A death before the pid entered the tracer's filter produced no
	// event: the process that connected may be gone already while another
	// (a forked child) holds the socket and completed the handshake.
	if processExited(s.pid) {
		s.log.Info("client process exited before its session was watched; freeing the session", "pid", s.pid)
		s.stop()
	}
}

// unwatchClient removes a closed session's pid from the filter.
func (d *Daemon) unwatchClient(s *session) {
	if s.watched {
		d.probes.exit.Remove(s.pid)
		s.watched = false
	}
}

// closeProbes detaches every program and waits for the reader goroutines.
func (d *Daemon) closeProbes() {
	p := d.probes
	if p == nil {
		return
	}
	var errs []error
	if p.exit != nil {
		errs = append(errs, p.exit.Close())
	}
	if p.io != nil {
		errs = append(errs, p.io.Close())
	}
	if p.vmscan != nil {
		errs = append(errs, p.vmscan.Close())
	}
	if err := errors.Join(errs...); err != nil {
		d.log.Warn("closing ebpf probes", "err", err)
	}
	p.wg.Wait()
}

// probeStats fills the status fields.
func (d *Daemon) probeStats(st *shm.Stats) {
	st.EBPF = d.probes.enabled()
	if d.probes == nil || d.probes.ctl == nil {
		return
	}
	c := d.probes.ctl.State()
	st.MemoryPressure = &shm.MemoryPressure{Source: c.Source, Pressure: c.Pressure, SomeAvg10: c.SomeAvg10,
		TargetRatio: c.TargetRatio, Shrinks: c.Shrinks, Grows: c.Grows}
}

var (
	descEBPFEnabled    = desc("ebpf_enabled", "1 when the eBPF program is loaded, 0 when its fallback is in use.", "program")
	descTargetRatio    = desc("host_target_ratio", "Host tier target as a share of its configured watermarks (1 full; lower under memory pressure).")
	descMemPressure    = desc("memory_pressure", "Host memory pressure the controller last sampled: percent of time stalled on memory.", "source")
	descClientExits    = desc("client_exit_sessions_total", "Sessions ended by an eBPF client exit event (before their socket's EOF).")
	descReclaimStalls  = desc("direct_reclaim_stalls_total", "Direct-reclaim stalls on the host (eBPF vmscan tracepoints).")
	descReclaimSeconds = desc("direct_reclaim_seconds_total", "Time tasks spent stalled in direct reclaim (eBPF vmscan tracepoints).")
)

// probesCollector exports the probes' state and the NVMe I/O histogram.
type probesCollector struct {
	d  *Daemon
	io *ebpf.IOCollector
}

func newProbesCollector(d *Daemon) *probesCollector {
	c := &probesCollector{d: d}
	c.io = ebpf.NewIOCollector(metricsNamespace, func() ebpf.HistogramReader {
		if d.probes == nil || d.probes.io == nil {
			return nil
		}
		return d.probes.io
	})
	return c
}

// Describe implements prometheus.Collector.
func (c *probesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEBPFEnabled, descTargetRatio, descMemPressure, descClientExits,
		descReclaimStalls, descReclaimSeconds} {
		ch <- d
	}
	c.io.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *probesCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.d.probes
	for prog, on := range p.enabled() {
		v := 0.0
		if on {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descEBPFEnabled, prometheus.GaugeValue, v, prog)
	}
	if p == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descClientExits, prometheus.CounterValue, float64(p.exits.Load()))
	if p.ctl != nil {
		s := p.ctl.State()
		ch <- prometheus.MustNewConstMetric(descTargetRatio, prometheus.GaugeValue, s.TargetRatio)
		ch <- prometheus.MustNewConstMetric(descMemPressure, prometheus.GaugeValue, s.Pressure, s.Source)
	}
	if p.vmscan != nil {
		if r, err := p.vmscan.Read(); err == nil {
			ch <- prometheus.MustNewConstMetric(descReclaimStalls, prometheus.CounterValue, float64(r.Stalls))
			ch <- prometheus.MustNewConstMetric(descReclaimSeconds, prometheus.CounterValue, r.StallTime.Seconds())
		}
	}
	c.io.Collect(ch)
}
