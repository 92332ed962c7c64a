package daemon

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/ebpf"
	"github.com/kvtier/kvtier/shm"
)

// families is one scrape, by family name.
type families map[string]*dto.MetricFamily

// value returns the value of the series of family name whose labels include
// every pair of labels (name1, value1, ...): the counter, gauge or untyped
// value, or a histogram's sample count. ok is false when there is none.
func (f families) value(name string, labels ...string) (v float64, ok bool) {
	mf := f[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

func (f families) must(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := f.value(name, labels...)
	if !ok {
		t.Fatalf("no series %s%v in the scrape", name, labels)
	}
	return v
}

// scrape fetches and parses /metrics over HTTP, like Prometheus does.
func scrape(t *testing.T, addr net.Addr) families {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	return mfs
}

// metricsDaemon runs a daemon in-process with metrics on a free loopback
// port, a 32MiB host tier of 4MiB slabs and (nvme) a 256MiB NVMe tier.
type metricsDaemon struct {
	d    *Daemon
	cfg  Config
	stop func() error
}

func startMetricsDaemon(t *testing.T, nvmeOn bool, extra ...string) *metricsDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "kvtm") // short: the socket path is bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	args := append([]string{"-runtime-dir", dir, "-state-dir", filepath.Join(dir, "state"),
		"-host-capacity", "128MiB", "-metrics-listen", "127.0.0.1:0"}, extra...)
	cfg, err := LoadFromArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host.Capacity, cfg.Host.SlabBytes = 32*MiB, 4*MiB // the default slab needs 128MiB
	cfg.Host.Prefault = false
	cfg.NVMe.Enabled = nvmeOn
	cfg.NVMe.Capacity = 256 * MiB
	cfg.NVMe.FlushOnStop = false
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	var runErr error
	md := &metricsDaemon{d: d, cfg: cfg}
	md.stop = func() error {
		if stopped {
			return runErr
		}
		stopped = true
		cancel()
		select {
		case runErr = <-done:
		case <-time.After(20 * time.Second):
			runErr = errors.New("daemon Run did not return")
		}
		return runErr
	}
	t.Cleanup(func() {
		if err := md.stop(); err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	return md
}

func testBlocks(seed uint64, n int) []client.Hash {
	toks := make([]uint32, 16*n)
	for i := range toks {
		toks[i] = uint32(i)
	}
	return client.ChainHashes(client.Hash{Hi: seed, Lo: ^seed}, toks, 16)
}

func block(h client.Hash, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(h.Lo>>(8*(i%8))) ^ byte(i)
	}
	return b
}

// TestMetricsMoveWithOps scrapes a running daemon, drives puts (past the
// host tier's capacity, so blocks are demoted), a lookup and gets (blocks
// in NVMe are promoted), a miss and a refused connection through the real
// socket, and checks that the scraped figures moved accordingly.
func TestMetricsMoveWithOps(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	md := startMetricsDaemon(t, true)
	addr := md.d.MetricsAddr()
	if addr == nil {
		t.Fatal("MetricsAddr is nil with metrics.listen set")
	}
	before := scrape(t, addr)
	for _, name := range []string{
		"kvtier_tier_hits_total", "kvtier_tier_misses_total", "kvtier_tier_resident_bytes",
		"kvtier_tier_resident_blocks", "kvtier_tier_capacity_bytes", "kvtier_tier_evictions_total",
		"kvtier_moves_total", "kvtier_moved_bytes_total", "kvtier_move_errors_total",
		"kvtier_op_duration_seconds", "kvtier_swap_in_seconds", "kvtier_swap_out_seconds",
		"kvtier_sessions", "kvtier_sessions_opened_total", "kvtier_parked_blocks", "kvtier_errors_total",
		"kvtier_nvme_disk_bytes", "kvtier_nvme_gc_runs_total",
		"kvtier_nvme_no_space_total", "kvtier_policy_refused_drops_total", "kvtier_nvme_oversize_drops_total", "kvtier_build_info", "go_goroutines",
	} {
		if before[name] == nil {
			t.Errorf("family %s missing from the scrape", name)
		}
	}
	// Families that could only ever read 0 mislead operators: the segment
	// store forces no memtable flush, so there are none to count.
	for _, name := range []string{"kvtier_nvme_lsm_flushes_total"} {
		if before[name] != nil {
			t.Errorf("family %s exported, but nothing can make it move", name)
		}
	}
	if runtime.GOOS == "linux" && before["process_resident_memory_bytes"] == nil {
		t.Error("process collector missing")
	}
	if got := before.must(t, "kvtier_tier_capacity_bytes", "tier", "host"); got != 32*MiB {
		t.Errorf("host capacity %v, want %d", got, 32*MiB)
	}
	if got := before.must(t, "kvtier_tier_capacity_bytes", "tier", "nvme"); got != 256*MiB {
		t.Errorf("nvme capacity %v, want %d", got, 256*MiB)
	}
	for op := shm.OpLookup; op.Valid(); op++ {
		if v := before.must(t, "kvtier_op_duration_seconds", "op", op.String()); v != 0 {
			t.Errorf("op %s: %v observations before any op", op, v)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Socket: md.cfg.Socket, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const bs = 1 << 20
	s, err := c.Open(ctx, client.Namespace{ModelID: "metrics", Layers: 2, KVHeads: 4, HeadDim: 64, DType: "fp16",
		TokensPerBlock: 16, TPSize: 1, BlockBytes: bs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v := scrape(t, addr).must(t, "kvtier_sessions"); v != 1 {
		t.Errorf("kvtier_sessions = %v with one session open", v)
	}

	// A block stored without its parent is an orphan: the policy refuses
	// it, and the mover drops it (counted as a host eviction) instead of
	// writing it down.
	orphan := testBlocks(7, 2)
	if _, err := s.Lookup(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, orphan[1], block(orphan[1], bs)); err != nil {
		t.Fatalf("put of the orphan: %v", err)
	}

	hs := testBlocks(3, 64) // 64MiB: twice the host tier
	for i, h := range hs {
		if _, err := s.Put(ctx, h, block(h, bs)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		// Let the mover demote (as a workload's think time would) rather
		// than the host tier drop blocks on a full Reserve.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			ht := md.d.Stats().Tiers[0]
			if float64(ht.UsedBytes) <= 0.95*float64(ht.CapacityBytes) {
				break
			}
		}
	}
	// The block put last is resident in the host tier: a deterministic host
	// hit. (Reading the chain from the front below is a cyclic scan twice the
	// host tier's size, which under recency may promote every block just
	// after the mover demoted it: no host hits at all.)
	dst := make([]byte, bs)
	if err := s.Get(ctx, hs[len(hs)-1], dst); err != nil {
		t.Fatalf("get of the block put last: %v", err)
	}
	res, err := s.Lookup(ctx, hs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Hits == 0 {
		t.Fatal("lookup: no hits")
	}
	got := 0
	for _, h := range hs[:res.Hits] {
		if err := s.Get(ctx, h, dst); err == nil {
			got++
		}
	}
	if got == 0 {
		t.Fatal("no get succeeded")
	}
	if err := s.Get(ctx, testBlocks(99, 1)[0], dst); err == nil {
		t.Fatal("get of a block never put succeeded")
	}
	// A peer that does not speak the protocol is refused and counted.
	raw, err := net.Dial("unixpacket", md.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	raw.Write([]byte("not a hello"))
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw.Read(make([]byte, 512))
	raw.Close()

	// Promotions of blocks prefetched by the lookup finish off the ring
	// loop; wait for the mover to settle into the scrape.
	var after families
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		after = scrape(t, addr)
		v, _ := after.value("kvtier_errors_total", "kind", "refused_connection")
		sw, _ := after.value("kvtier_swap_in_seconds")
		if (v >= 1 && sw >= 1) || time.Now().After(deadline) {
			break
		}
	}

	increased := func(name string, labels ...string) float64 {
		t.Helper()
		b, a := before.must(t, name, labels...), after.must(t, name, labels...)
		if a <= b {
			t.Errorf("%s%v did not increase: %v → %v", name, labels, b, a)
		}
		return a - b
	}
	if n := increased("kvtier_tier_evictions_total", "tier", "host"); n != 1 {
		t.Errorf("host evictions rose by %v, want 1 (the refused orphan; the puts waited for the mover)", n)
	}
	if n := increased("kvtier_policy_refused_drops_total"); n != 1 {
		t.Errorf("refused drops rose by %v, want 1", n)
	}
	if err := s.Get(ctx, orphan[1], dst); err == nil {
		t.Error("the refused orphan is still cached after the mover passed")
	}
	increased("kvtier_tier_hits_total", "tier", "host")
	increased("kvtier_tier_misses_total", "tier", "host")
	increased("kvtier_tier_misses_total", "tier", "nvme")
	increased("kvtier_tier_resident_blocks", "tier", "host")
	increased("kvtier_tier_resident_bytes", "tier", "host")
	increased("kvtier_tier_resident_blocks", "tier", "nvme")
	increased("kvtier_moves_total", "from", "host", "to", "nvme")
	increased("kvtier_moved_bytes_total", "from", "host", "to", "nvme")
	increased("kvtier_moves_total", "from", "nvme", "to", "host")
	increased("kvtier_moved_bytes_total", "from", "nvme", "to", "host")
	increased("kvtier_swap_out_seconds")
	increased("kvtier_swap_in_seconds")
	increased("kvtier_sessions_opened_total")
	increased("kvtier_nvme_puts_total")
	increased("kvtier_nvme_segment_writes_total")
	increased("kvtier_nvme_segment_reads_total")
	if n := increased("kvtier_op_duration_seconds", "op", "reserve"); n < float64(len(hs)) {
		t.Errorf("reserve observed %v times, want ≥ %d", n, len(hs))
	}
	if n := increased("kvtier_op_duration_seconds", "op", "commit"); n < float64(len(hs)) {
		t.Errorf("commit observed %v times, want ≥ %d", n, len(hs))
	}
	if n := increased("kvtier_op_duration_seconds", "op", "lookup"); n < 1 {
		t.Errorf("lookup observed %v times", n)
	}
	if n := increased("kvtier_op_duration_seconds", "op", "acquire"); n < float64(got+1) {
		t.Errorf("acquire observed %v times, want ≥ %d", n, got+1)
	}
	increased("kvtier_op_duration_seconds", "op", "release")
	if v := after.must(t, "kvtier_errors_total", "kind", "refused_connection"); v != 1 {
		t.Errorf("refused_connection = %v, want 1", v)
	}
	if v := after.must(t, "kvtier_errors_total", "kind", "hostile_session"); v != 0 {
		t.Errorf("hostile_session = %v, want 0", v)
	}

	// The collector reads the same counters as the status report.
	st := md.d.Stats()
	final := scrape(t, addr)
	if h, m := final.must(t, "kvtier_tier_hits_total", "tier", "host"), final.must(t, "kvtier_tier_misses_total", "tier", "host"); h != float64(st.Tiers[0].Hits) || m != float64(st.Tiers[0].Misses) {
		t.Errorf("host hits/misses %v/%v, status %d/%d", h, m, st.Tiers[0].Hits, st.Tiers[0].Misses)
	}
	// The op histogram has buckets from 16ns, the swap histograms from 1µs.
	for _, h := range []struct {
		name  string
		first float64
	}{{"kvtier_op_duration_seconds", 16e-9}, {"kvtier_swap_in_seconds", 1e-6}, {"kvtier_swap_out_seconds", 1e-6}} {
		for _, m := range final[h.name].GetMetric() {
			if b := m.GetHistogram().GetBucket(); len(b) == 0 || b[0].GetUpperBound() != h.first {
				t.Fatalf("%s buckets start at %v, want %v", h.name, b, h.first)
			}
		}
	}

	s.Close()
	c.Close()
	if err := md.stop(); err != nil {
		t.Fatal(err)
	}
	// The endpoint is gone with the daemon.
	if conn, err := net.DialTimeout("tcp", addr.String(), time.Second); err == nil {
		conn.Close()
		t.Error("metrics endpoint still accepts connections after Run returned")
	}
}

func TestMetricsDisabled(t *testing.T) {
	md := startMetricsDaemon(t, false, "-metrics-listen", "")
	if md.d.MetricsAddr() != nil || md.d.Registry() != nil {
		t.Fatalf("metrics on with metrics.listen empty: %v", md.d.MetricsAddr())
	}
	// The ring loop and the chain run without instruments.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Socket: md.cfg.Socket, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, client.Namespace{ModelID: "m", Layers: 1, KVHeads: 1, HeadDim: 64, DType: "fp16",
		TokensPerBlock: 16, TPSize: 1, BlockBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Nop(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsPortTaken: a metrics address that cannot be bound does not
// stop the cache from serving.
func TestMetricsPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	md := startMetricsDaemon(t, false, "-metrics-listen", ln.Addr().String())
	if md.d.MetricsAddr() != nil {
		t.Fatalf("metrics bound to %v, which another listener holds", md.d.MetricsAddr())
	}
	if md.d.Registry() == nil {
		t.Fatal("registry missing")
	}
}

func TestMetricsListenValidation(t *testing.T) {
	for _, tt := range []struct {
		v  string
		ok bool
	}{
		{"", true}, {"127.0.0.1:9477", true}, {":9477", true}, {"[::1]:0", true}, {"localhost:9477", true},
		{"9477", false}, {"127.0.0.1", false}, {"127.0.0.1:http", false}, {"127.0.0.1:70000", false},
	} {
		err := validListen(tt.v)
		if (err == nil) != tt.ok {
			t.Errorf("validListen(%q) = %v, want ok=%v", tt.v, err, tt.ok)
		}
	}
	e := fakeEnv(1000, nil, bigMem)
	fs := flag.NewFlagSet("kvtierd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := BindFlags(fs)
	if err := fs.Parse([]string{"-runtime-dir", "/r", "-state-dir", "/s", "-metrics-listen", "nope"}); err != nil {
		t.Fatal(err)
	}
	_, err := f.load(e)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "metrics.listen" || fe.Flag != "metrics-listen" {
		t.Fatalf("err = %v, want a FieldError naming metrics.listen and -metrics-listen", err)
	}
	p := writeTOML(t, "[metrics]\nlisten = \"0.0.0.0:9100\"\n")
	c, err := e.load(p, nil)
	if err != nil || c.Metrics.Listen != "0.0.0.0:9100" {
		t.Fatalf("file: %+v, %v", c.Metrics, err)
	}
}

// TestObserveOpAllocs: the ring loop's instrument costs no allocation.
func TestObserveOpAllocs(t *testing.T) {
	m := newMetrics(&Daemon{})
	var nilM *metrics
	if n := testing.AllocsPerRun(1000, func() {
		m.observeOp(shm.OpAcquire, 3*time.Microsecond)
		m.observeOp(shm.Op(200), time.Microsecond) // invalid: ignored
		nilM.observeOp(shm.OpNop, time.Microsecond)
	}); n != 0 {
		t.Fatalf("observeOp allocates %v times per call", n)
	}
	var out dto.Metric
	if err := m.ops[shm.OpAcquire].(prometheus.Metric).Write(&out); err != nil {
		t.Fatal(err)
	}
	if n := out.GetHistogram().GetSampleCount(); n != 1001 { // AllocsPerRun warms up once
		t.Errorf("acquire observed %d times, want 1001", n)
	}
}

// failingHistograms is an eBPF histogram source whose map reads fail.
type failingHistograms struct{}

func (failingHistograms) Read(int) (ebpf.Histogram, error) {
	return ebpf.Histogram{}, errors.New("map lookup: bad file descriptor")
}

// TestMetricsScrapeSurvivesCollectorError: one collector that cannot read
// its source (an eBPF map read failing, /proc/self/fd unreadable under fd
// exhaustion) loses its own series, not the whole endpoint: the scrape
// still answers 200 with every other family, and counts the error.
func TestMetricsScrapeSurvivesCollectorError(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // runs after the daemon's cleanup
	md := startMetricsDaemon(t, false)
	// The real I/O latency collector over a source that fails (its own
	// namespace: the daemon's collector already holds kvtier's name).
	md.d.Registry().MustRegister(ebpf.NewIOCollector("kvtiertest", func() ebpf.HistogramReader { return failingHistograms{} }))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + md.d.MetricsAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape with one failing collector: %s, want 200 OK (%.200s)", resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	f := families(mfs)
	for _, name := range []string{"kvtier_sessions", "kvtier_tier_hits_total", "kvtier_build_info"} {
		if f[name] == nil {
			t.Errorf("family %s missing from a scrape where only another collector failed", name)
		}
	}
	if f["kvtiertest_nvme_io_latency_seconds"] != nil {
		t.Error("the failing collector's family was exported")
	}
	// Counted once the failed gathering is served: seen by the next scrape.
	if v := scrape(t, md.d.MetricsAddr()).must(t, "promhttp_metric_handler_errors_total", "cause", "gathering"); v < 1 {
		t.Errorf("promhttp_metric_handler_errors_total{cause=gathering} = %v, want ≥ 1", v)
	}
}

// quantile is Prometheus' histogram_quantile over one histogram's buckets:
// linear interpolation inside the bucket that holds the rank, from 0 for
// the first.
func quantile(q float64, h *dto.Histogram) float64 {
	rank := q * float64(h.GetSampleCount())
	lower, below := 0.0, 0.0
	for _, b := range h.GetBucket() {
		n := float64(b.GetCumulativeCount())
		if math.IsInf(b.GetUpperBound(), 1) {
			return lower
		}
		if n >= rank {
			if n == below {
				return b.GetUpperBound()
			}
			return lower + (b.GetUpperBound()-lower)*(rank-below)/(n-below)
		}
		lower, below = b.GetUpperBound(), n
	}
	return lower
}

// TestOpLatencyBucketsResolveDispatch: the ring loop's dispatch of most ops
// takes well under a microsecond (a nop tens of nanoseconds, a release or
// an acquire of a resident block a few hundred: docs/benchmarks.md), so the
// op histogram's buckets must reach below 1 µs, or every observation lands
// in the first bucket and the dashboard's p50/p99 panels draw that
// bucket's interpolation (0.5 µs, 0.99 µs) whatever the daemon does. The
// top must still hold a slow lookup of a long chain.
func TestOpLatencyBucketsResolveDispatch(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // runs after the daemon's cleanup
	md := startMetricsDaemon(t, false)
	ctx, s := openMetricsSession(t, md, 4096)
	const nops = 1000
	for i := 0; i < nops; i++ {
		if err := s.Nop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f := scrape(t, md.d.MetricsAddr())
	var nop *dto.Histogram
	for _, m := range f["kvtier_op_duration_seconds"].GetMetric() {
		b := m.GetHistogram().GetBucket()
		if len(b) == 0 {
			t.Fatal("op histogram without buckets")
		}
		last := b[len(b)-1].GetUpperBound()
		if math.IsInf(last, 1) && len(b) > 1 { // the text format lists +Inf
			last = b[len(b)-2].GetUpperBound()
		}
		if first := b[0].GetUpperBound(); first > 100e-9 || last < 1 {
			t.Errorf("op %v: buckets %v .. %v s, want from ≤ 100ns to ≥ 1s", m.GetLabel(), first, last)
		}
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "op" && lp.GetValue() == "nop" {
				nop = m.GetHistogram()
			}
		}
	}
	if nop == nil || nop.GetSampleCount() < nops {
		t.Fatalf("nop histogram %v, want ≥ %d observations", nop, nops)
	}
	// A nop's dispatch does nothing: tens of nanoseconds (more on a loaded
	// machine or under the race detector). With most of them in the first
	// bucket, histogram_quantile interpolates the median from zero to that
	// bucket's bound: the panel draws the bucket, not the dispatch time.
	if first := float64(nop.GetBucket()[0].GetCumulativeCount()); first >= 0.5*float64(nop.GetSampleCount()) {
		t.Errorf("%v of %d nops in the first bucket (≤ %v s; mean %v s, p50 read from the buckets %v s): the buckets do not resolve the dispatch time",
			first, nop.GetSampleCount(), nop.GetBucket()[0].GetUpperBound(),
			nop.GetSampleSum()/float64(nop.GetSampleCount()), quantile(0.5, nop))
	}
}
