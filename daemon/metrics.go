package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
)

// Metrics live on a registry owned by the daemon (never the global one), so
// that two daemons in one process (tests) do not collide. Most families are
// read from the tiers' own counters at scrape time by statsCollector (no
// second bookkeeping on the hot path); only the latency histograms are
// observed where the work happens. docs/metrics.md lists every family.

const metricsNamespace = "kvtier"

// metricsShutdownTimeout bounds how long Run waits for scrapes in flight.
const metricsShutdownTimeout = 2 * time.Second

// latencyBuckets span 1µs .. ~4.2s: a swap of a large block from a busy
// disk can take a second.
var latencyBuckets = prometheus.ExponentialBuckets(1e-6, 2, 23)

// opBuckets span 16ns .. ~4.3s: the ring loop dispatches most ops in well
// under a microsecond (a nop in tens of nanoseconds, a release or an
// acquire of a resident block in hundreds), which buckets from 1µs would
// all put in the first bucket; a lookup of a long chain takes milliseconds.
var opBuckets = prometheus.ExponentialBuckets(16e-9, 2, 29)

// metrics is the daemon's registry and the instruments observed on the hot
// paths. A nil *metrics (metrics disabled) is valid: every method is a no-op.
type metrics struct {
	reg *prometheus.Registry
	// ops holds one pre-resolved Observer per valid op, indexed by shm.Op,
	// so the ring loop observes without a label lookup or an allocation.
	ops     [16]prometheus.Observer
	swapIn  prometheus.Histogram
	swapOut prometheus.Histogram

	refused atomic.Uint64 // connections refused as unauthorized or malformed

	ln  net.Listener // bound in New, served by Run
	srv *http.Server
}

func newMetrics(d *Daemon) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	opLatency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Name: "op_duration_seconds",
		Help:    "Time the ring loop spent executing one submitted op (dispatch only; a promotion an acquire waits for is in kvtier_swap_in_seconds).",
		Buckets: opBuckets,
	}, []string{"op"})
	for op := shm.OpLookup; op.Valid(); op++ {
		m.ops[op] = opLatency.WithLabelValues(op.String())
	}
	m.swapIn = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Name: "swap_in_seconds",
		Help:    "Time to promote one block NVMe → host (room-making demotions, disk read, commit); blocks promoted in one batch each observe the batch's time.",
		Buckets: latencyBuckets,
	})
	m.swapOut = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Name: "swap_out_seconds",
		Help:    "Time to write one block down host → NVMe (demotion, park write-through, flush); blocks written in one batch each observe the batch's time.",
		Buckets: latencyBuckets,
	})
	m.reg.MustRegister(
		opLatency, m.swapIn, m.swapOut,
		&statsCollector{d: d},
		newProbesCollector(d), // ebpf.go
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Registry returns the daemon's metrics registry, nil when metrics are
// disabled (metrics.listen = "").
func (d *Daemon) Registry() *prometheus.Registry {
	if d.metrics == nil {
		return nil
	}
	return d.metrics.reg
}

// MetricsAddr returns the address the metrics endpoint is bound to (useful
// with a ":0" port), nil when metrics are disabled.
func (d *Daemon) MetricsAddr() net.Addr {
	if d.metrics == nil || d.metrics.ln == nil {
		return nil
	}
	return d.metrics.ln.Addr()
}

// observeOp records the latency of one dispatched op. Allocation-free.
func (m *metrics) observeOp(op shm.Op, dt time.Duration) {
	if m == nil || int(op) >= len(m.ops) || m.ops[op] == nil {
		return
	}
	m.ops[op].Observe(dt.Seconds())
}

// swapInHook and swapOutHook are the tier chain's observers (nil when
// metrics are off, which the chain skips).
func (m *metrics) swapInHook() func(time.Duration) {
	if m == nil {
		return nil
	}
	return func(dt time.Duration) { m.swapIn.Observe(dt.Seconds()) }
}

func (m *metrics) swapOutHook() func(time.Duration) {
	if m == nil {
		return nil
	}
	return func(dt time.Duration) { m.swapOut.Observe(dt.Seconds()) }
}

// countRefused counts a connection refused before it became a session for
// a reason that points at the peer (unauthorized, bad handshake, version).
func (m *metrics) countRefused(code shm.ErrCode) {
	if m == nil {
		return
	}
	switch code {
	case shm.CodeUnauthorized, shm.CodeBadRequest, shm.CodeVersion:
		m.refused.Add(1)
	}
}

// listenMetrics binds the metrics address; New calls it once the daemon
// can serve. Like an unavailable NVMe tier, a metrics address that cannot
// be bound (port taken) is logged loudly and the cache serves without the
// endpoint: the cache matters more than its figures.
func (d *Daemon) listenMetrics() {
	if d.metrics == nil {
		d.log.Info("metrics disabled by configuration")
		return
	}
	ln, err := net.Listen("tcp", d.cfg.Metrics.Listen)
	if err != nil {
		d.log.Error("metrics endpoint unavailable; serving without it", "addr", d.cfg.Metrics.Listen, "err", err)
		return
	}
	d.metrics.ln = ln
	d.log.Info("metrics listening", "addr", ln.Addr().String(), "path", "/metrics")
}

// closeListener releases a bound address that Run never served.
func (m *metrics) closeListener() {
	if m != nil && m.ln != nil {
		m.ln.Close()
	}
}

// serveMetrics serves /metrics until the returned stop is called (Run
// defers it, so the endpoint answers while sessions drain and is gone
// before the tiers close).
func (d *Daemon) serveMetrics() (stop func()) {
	m := d.metrics
	if m == nil || m.ln == nil {
		return func() {}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.InstrumentMetricHandler(m.reg,
		promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, ErrorLog: slogPrinter{d}, Timeout: 10 * time.Second,
			// A collector that cannot read its source (an eBPF map, or
			// /proc/self/fd under fd exhaustion) loses its own series,
			// logged and counted in promhttp_metric_handler_errors_total,
			// not the whole scrape.
			ErrorHandling: promhttp.ContinueOnError})))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "kvtierd %s: metrics at /metrics\n", Version)
	})
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := m.srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("metrics server stopped", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), metricsShutdownTimeout)
		defer cancel()
		if err := m.srv.Shutdown(ctx); err != nil {
			m.srv.Close()
		}
		<-done
	}
}

// slogPrinter adapts the daemon's logger to promhttp's ErrorLog.
type slogPrinter struct{ d *Daemon }

func (p slogPrinter) Println(v ...any) { p.d.log.Warn("metrics scrape", "err", fmt.Sprint(v...)) }

// statsCollector reads the tiers' and the daemon's counters at scrape time.
type statsCollector struct{ d *Daemon }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "", name), help, labels, nil)
}

var (
	descTierHits      = desc("tier_hits_total", "Acquires (gets) the tier served: host: found resident; nvme: missed the host tier and were promoted from NVMe; gpuN: served from that GPU's arena (its device readers, and readers elsewhere copied from it).", "tier")
	descTierMisses    = desc("tier_misses_total", "Acquires the tier could not serve (a host miss falls through to nvme; an nvme miss is a miss of the whole chain).", "tier")
	descTierBytes     = desc("tier_resident_bytes", "Payload bytes held by the tier (host: including reserved and deleted-but-leased blocks).", "tier")
	descTierBlocks    = desc("tier_resident_blocks", "Committed blocks in the tier's index.", "tier")
	descTierCapacity  = desc("tier_capacity_bytes", "Configured capacity of the tier.", "tier")
	descTierEvictions = desc("tier_evictions_total", "Blocks dropped by the tier to make room (not demotions: those are kvtier_moves_total).", "tier")

	descHostReserved    = desc("host_reserved_blocks", "Host reservations not yet committed or aborted.")
	descHostLeased      = desc("host_leased_blocks", "Host blocks with at least one lease held by a client.")
	descHostCompactions = desc("host_compactions_total", "Host slabs freed by compaction.")

	descMoves      = desc("moves_total", "Blocks moved between tiers (host→nvme: demotions and park write-throughs; nvme→host: promotions).", "from", "to")
	descMovedBytes = desc("moved_bytes_total", "Bytes moved between tiers.", "from", "to")
	descMoveErrors = desc("move_errors_total", "Blocks whose move between tiers failed (a failed batch counts each of its blocks).", "from", "to")
	descPrefetch   = desc("prefetches_total", "Promotions queued by a lookup that found blocks only in NVMe.")
	descPrefDrops  = desc("prefetches_dropped_total", "Prefetches skipped because the promotion queue was full.")
	descRefused    = desc("policy_refused_drops_total", "Host blocks the replacement policy refused (orphans), dropped by the mover instead of written down; also in kvtier_tier_evictions_total{tier=\"host\"}.")
	descOversize   = desc("nvme_oversize_drops_total", "Host blocks larger than the NVMe tier's largest block, dropped by the mover (the host is their last tier); also in kvtier_tier_evictions_total{tier=\"host\"}.")

	descSessions     = desc("sessions", "Sessions open now.")
	descSessionsOpen = desc("sessions_opened_total", "Sessions opened since start.")
	descParked       = desc("parked_blocks", "Blocks of parked (swapped-out) requests held by the daemon.")
	descParkExpired  = desc("parked_expired_total", "Parked blocks deleted because their TTL passed.")
	descParkRefused  = desc("park_refused_total", "Parked block reservations refused because parked blocks hold nvme.parked_share of the NVMe tier (the engine's Park fails with ErrFull and it recomputes instead).")
	descParkedBytes  = desc("parked_nvme_bytes", "Bytes of parked blocks on the NVMe tier, capped near nvme.parked_share of its budget.")
	descNSReclaimed  = desc("namespaces_reclaimed_total", "Idle namespaces (no session, no block in any tier, not registered for 10 minutes) the full namespace registry forgot to admit new ones.")
	descErrors       = desc("errors_total", "Errors by kind: hostile_session, checksum_miss, demote, promote, park, policy_event_drop, refused_connection.", "kind")

	descGPULeased     = desc("gpu_leased_blocks", "GPU arena blocks with at least one lease (leased blocks are never demoted or migrated).", "tier")
	descGPUReserved   = desc("gpu_reserved_blocks", "GPU arena reservations not yet committed or aborted.", "tier")
	descGPUDemotions  = desc("gpu_demotions_total", "Blocks the GPU arena's demoter moved to the host tier.", "tier")
	descGPUFallbacks  = desc("gpu_promotion_fallbacks_total", "Device reads of host blocks served from the host tier because the GPU arena had no room to promote them (each kicks the demoter).", "tier")
	descQuarantined   = desc("quarantined_reservations", "Reservations of ended sessions held until their process exits (the client may still write them: a copy queued on its GPU, or a memcpy through its mapping of the host arena).")
	descQuarantTotal  = desc("quarantined_reservations_total", "Reservations ever held in quarantine.")
	descGPUCompactErr = desc("gpu_compaction_errors_total", "Failed device-to-device copies of GPU arena compaction.")

	descNVMeDisk      = desc("nvme_disk_bytes", "Bytes the NVMe tier's directory occupies on disk (LSM, value log, manifest), last measurement.")
	descNVMeLimit     = desc("nvme_logical_limit_bytes", "Logical bytes the NVMe tier holds before it evicts (adapts to badger's space amplification).")
	descNVMePuts      = desc("nvme_puts_total", "Blocks written to the NVMe store.")
	descNVMeWrites    = desc("nvme_segment_writes_total", "Segment file writes of the NVMe store: batched puts write several blocks at once (kvtier_nvme_puts_total / this = blocks per write).")
	descNVMeReads     = desc("nvme_segment_reads_total", "Segment file reads of the NVMe store: batched promotions read blocks lying back to back at once (kvtier_nvme_store_hits_total / this = blocks per read).")
	descNVMeNoSpace   = desc("nvme_no_space_total", "NVMe writes refused because the disk budget was exhausted.")
	descNVMeGC        = desc("nvme_gc_runs_total", "Badger value-log files rewritten or removed by garbage collection.")
	descNVMeReindex   = desc("nvme_reindex_blocks", "Blocks re-indexed from disk when the NVMe tier opened.")
	descNVMeReindexS  = desc("nvme_reindex_seconds", "Time the re-index at open took.")
	descNVMeReadHits  = desc("nvme_store_hits_total", "Reads the NVMe store served (promotions and prefetches).")
	descNVMeReadMisss = desc("nvme_store_misses_total", "Reads the NVMe store could not serve (absent or failed verification).")

	descBuildInfo = desc("build_info", "Always 1; labels carry the daemon version and the replacement policy.", "version", "policy")
)

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descTierHits, descTierMisses, descTierBytes, descTierBlocks, descTierCapacity, descTierEvictions,
		descHostReserved, descHostLeased, descHostCompactions,
		descMoves, descMovedBytes, descMoveErrors, descPrefetch, descPrefDrops, descRefused, descOversize,
		descSessions, descSessionsOpen, descParked, descParkExpired, descParkRefused, descParkedBytes, descNSReclaimed, descErrors,
		descGPULeased, descGPUReserved, descGPUDemotions, descGPUFallbacks, descGPUCompactErr,
		descQuarantined, descQuarantTotal,
		descNVMeDisk, descNVMeLimit, descNVMePuts, descNVMeWrites, descNVMeReads, descNVMeNoSpace, descNVMeGC,
		descNVMeReindex, descNVMeReindexS, descNVMeReadHits, descNVMeReadMisss,
		descBuildInfo,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It runs on the HTTP server's
// goroutine; Run stops that server before the tiers close.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	counter := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}

	hs, cs := d.host.Stats(), d.chain.Stats()
	counter(descTierHits, hs.Hits, "host")
	counter(descTierMisses, hs.Misses, "host")
	gauge(descTierBytes, float64(hs.UsedBytes), "host")
	gauge(descTierBlocks, float64(hs.Blocks), "host")
	gauge(descTierCapacity, float64(d.hostCapacity(hs.CapacityBytes)), "host")
	counter(descTierEvictions, hostEvictions(hs, cs), "host")
	gauge(descHostReserved, float64(hs.Reserved))
	gauge(descHostLeased, float64(hs.Leased))
	counter(descHostCompactions, hs.Compactions)

	var checksumMisses uint64
	if d.nvme != nil {
		ns := d.nvme.Stats()
		checksumMisses = ns.ChecksumMisses
		counter(descTierHits, cs.NVMeHits, "nvme")
		counter(descTierMisses, cs.NVMeMisses, "nvme")
		gauge(descTierBytes, float64(ns.Bytes), "nvme")
		gauge(descTierBlocks, float64(ns.Blocks), "nvme")
		gauge(descTierCapacity, float64(ns.Capacity), "nvme")
		counter(descTierEvictions, ns.Evictions, "nvme")
		gauge(descNVMeDisk, float64(ns.DiskBytes))
		gauge(descNVMeLimit, float64(ns.LogicalLimit))
		counter(descNVMePuts, ns.Puts)
		counter(descNVMeWrites, ns.SegmentWrites)
		counter(descNVMeReads, ns.SegmentReads)
		counter(descNVMeNoSpace, ns.NoSpace)
		counter(descNVMeGC, ns.GCRuns)
		gauge(descNVMeReindex, float64(ns.ReindexBlocks))
		gauge(descNVMeReindexS, ns.ReindexDuration.Seconds())
		counter(descNVMeReadHits, ns.Hits)
		counter(descNVMeReadMisss, ns.Misses)
	}

	counter(descMoves, cs.Demoted, "host", "nvme")
	counter(descMovedBytes, cs.DemotedBytes, "host", "nvme")
	counter(descMoveErrors, cs.DemoteErrors, "host", "nvme")
	counter(descMoves, cs.Promoted, "nvme", "host")
	counter(descMovedBytes, cs.PromotedBytes, "nvme", "host")
	counter(descMoveErrors, cs.PromoteErrors, "nvme", "host")
	if d.gpus != nil {
		gst := d.gpus.Stats()
		for i, gs := range gst.Devices {
			tier := gpuTierName(i)
			counter(descTierHits, gs.Hits, tier)
			counter(descTierMisses, gs.Misses, tier)
			gauge(descTierBytes, float64(gs.UsedBytes), tier)
			gauge(descTierBlocks, float64(gs.Blocks), tier)
			gauge(descTierCapacity, float64(gs.CapacityBytes), tier)
			counter(descTierEvictions, gs.Evictions, tier)
			gauge(descGPULeased, float64(gs.Leased), tier)
			gauge(descGPUReserved, float64(gs.Reserved), tier)
			counter(descGPUDemotions, gst.Demotions[i], tier)
			counter(descGPUFallbacks, gst.PromotionFallbacks[i], tier)
		}
		for _, m := range []struct {
			from, to string
			s        tiers.MoveStats
		}{{"gpu", "host", gst.GPUToHost}, {"host", "gpu", gst.HostToGPU}, {"gpu", "gpu", gst.GPUToGPU}} {
			counter(descMoves, m.s.Blocks, m.from, m.to)
			counter(descMovedBytes, m.s.Bytes, m.from, m.to)
			counter(descMoveErrors, m.s.Errors, m.from, m.to)
		}
		counter(descGPUCompactErr, gst.CompactErrors)
	}
	counter(descPrefetch, cs.Prefetches)
	counter(descPrefDrops, cs.PrefetchDropped)
	counter(descRefused, cs.RefusedDrops)
	counter(descOversize, cs.OversizeDrops)
	gauge(descParked, float64(cs.ParkedBlocks))
	counter(descParkExpired, cs.ParkExpired)
	counter(descParkRefused, cs.ParkRefused)
	gauge(descParkedBytes, float64(cs.ParkedNVMeBytes))

	d.mu.Lock()
	open := len(d.sessions)
	d.mu.Unlock()
	gauge(descSessions, float64(open))
	gauge(descQuarantined, float64(d.quar.blocks.Load()))
	counter(descQuarantTotal, d.quar.total.Load())
	counter(descSessionsOpen, d.sessionsTotal.Load())
	counter(descNSReclaimed, d.reg.Reclaimed())

	var refused uint64
	if d.metrics != nil {
		refused = d.metrics.refused.Load()
	}
	for _, e := range []struct {
		kind string
		v    uint64
	}{
		{"hostile_session", d.sessionsBad.Load()},
		{"checksum_miss", checksumMisses},
		{"demote", cs.DemoteErrors},
		{"promote", cs.PromoteErrors},
		{"park", cs.ParkErrors},
		{"policy_event_drop", cs.PolicyEventDrops},
		{"refused_connection", refused},
	} {
		counter(descErrors, e.v, e.kind)
	}
	gauge(descBuildInfo, 1, Version, d.chain.PolicyName())
}

// validListen checks a metrics.listen value: "" or host:port with a numeric
// port (the host may be empty, an IP or a name).
func validListen(s string) error {
	if s == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number in 0..65535", port)
	}
	return nil
}
