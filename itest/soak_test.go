package itest

// Load and soak (issue: evidence, point 3): 64 sessions of mixed,
// self-checking ops against a daemon process for -soak.duration, with the
// throughput, the daemon's RSS and its goroutine count sampled every second.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
)

var (
	soakDuration = flag.Duration("soak.duration", 5*time.Second, "how long TestSoak runs its load (after the prefill)")
	soakSessions = flag.Int("soak.sessions", 64, "concurrent sessions of TestSoak")
)

// procStatus reads kB fields of /proc/<pid>/status (VmRSS, RssAnon, ...).
func procStatus(t testing.TB, pid int, fields ...string) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatalf("daemon status: %v", err)
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		for _, f := range fields {
			if k == f {
				n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				out[f] = n << 10
			}
		}
	}
	return out
}

// scrapeGauge fetches /metrics and returns one unlabelled gauge. No
// keep-alive: an idle connection would hold a daemon goroutine.
func scrapeGauge(t testing.TB, addr, name string) float64 {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("scrape %s: %q", name, v)
			}
			return f
		}
	}
	t.Fatalf("scrape: no %s", name)
	return 0
}

// TestSoak: -soak.sessions sessions (8 per client) each own 16 blocks and
// share 16 more; each runs put/get/lookup/delete at random with every
// answer checked (nothing is evicted, so a miss, an unexpected hit or a
// differing byte is an error) and reopens its session every 500 ops. It
// logs ops/s, the daemon's VmRSS and its goroutine count every second;
// after a warm-up (the first fifth, at least 1 s) RSS may grow by less
// than 20%; after the sessions close the daemon's goroutines are back to
// their count before any session opened, and the tier's reserved, leased
// and used bytes are back to their pre-load values once the load's blocks
// are deleted.
func TestSoak(t *testing.T) {
	dir := tmpDir(t)
	d := daemonProc(t, dir, map[string]string{envCapacity: "128MiB", envMetrics: "127.0.0.1:0"})
	addrB, err := os.ReadFile(filepath.Join(dir, "metrics.addr"))
	if err != nil {
		t.Fatal(err)
	}
	addr := string(addrB)
	sock := socketOf(dir)
	const (
		bs       = 64 << 10
		own      = 16 // blocks per session: 64 × 16 × 64 KiB = 64 MiB
		nShared  = 16
		perConn  = 8
		reopenAt = 500
	)
	nSess := *soakSessions
	ctx := context.Background()
	admin := dial(t, sock)
	ns := testNS("itest", bs)
	goroutines0 := scrapeGauge(t, addr, "go_goroutines")
	setup := open(t, admin, ns)
	shared := chain(11000, nShared)
	sharedBlocks := make([][]byte, nShared)
	for i, h := range shared {
		sharedBlocks[i] = payload(h, bs)
	}
	if k, err := setup.PutBatch(ctx, shared, sharedBlocks); err != nil || k != nShared {
		t.Fatalf("put shared: %d %v", k, err)
	}
	setup.Close()
	base := stats(t, admin)
	b0 := base.Tiers[0]

	clients := make([]*client.Client, (nSess+perConn-1)/perConn)
	for i := range clients {
		clients[i] = dial(t, sock)
	}
	type worker struct {
		s      *client.Session
		own    []client.Hash
		stored []bool
		rng    *mrand.Rand
	}
	ws := make([]*worker, nSess)
	for i := range ws {
		w := &worker{s: open(t, clients[i/perConn], ns), own: chain(uint64(12000+i), own), stored: make([]bool, own),
			rng: mrand.New(mrand.NewPCG(uint64(i), 11))}
		// Prefill: the working set is in the arena before the clock runs.
		blocks := make([][]byte, own)
		for j, h := range w.own {
			blocks[j] = payload(h, bs)
			w.stored[j] = true
		}
		if k, err := w.s.PutBatch(ctx, w.own, blocks); err != nil || k != own {
			t.Fatalf("prefill %d: %d %v", i, k, err)
		}
		ws[i] = w
	}
	peakSessions := stats(t, admin).Sessions

	var ops, reopens atomic.Int64
	var stop atomic.Bool
	var badMu sync.Mutex
	var bad []error
	failW := func(err error) {
		badMu.Lock()
		bad = append(bad, err)
		badMu.Unlock()
		stop.Store(true)
	}
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i/perConn]
			got, want := make([]byte, bs), make([]byte, bs)
			for n := 1; !stop.Load(); n++ {
				if n%reopenAt == 0 {
					w.s.Close()
					s, err := c.Open(ctx, ns)
					if err != nil {
						failW(fmt.Errorf("session %d: reopen: %w", i, err))
						return
					}
					w.s = s
					reopens.Add(1)
				}
				s := w.s
				switch r := w.rng.IntN(10); {
				case r < 3:
					j := w.rng.IntN(own)
					fillPayload(want, w.own[j])
					ok, err := s.Put(ctx, w.own[j], want)
					if err != nil || ok == w.stored[j] {
						failW(fmt.Errorf("session %d: put %d: stored=%v err=%v, cached before=%v", i, j, ok, err, w.stored[j]))
						return
					}
					w.stored[j] = true
				case r < 6:
					h, present := shared[w.rng.IntN(nShared)], true
					if w.rng.IntN(2) == 0 {
						j := w.rng.IntN(own)
						h, present = w.own[j], w.stored[j]
					}
					err := s.Get(ctx, h, got)
					switch {
					case !present && errors.Is(err, client.ErrNotFound):
					case err != nil || !present:
						failW(fmt.Errorf("session %d: get (present=%v): %v", i, present, err))
						return
					default:
						fillPayload(want, h)
						if !bytes.Equal(got, want) {
							failW(fmt.Errorf("session %d: get %s: bytes differ", i, h))
							return
						}
					}
				case r < 8:
					lead := 0
					for lead < own && w.stored[lead] {
						lead++
					}
					lr, err := s.Lookup(ctx, w.own)
					if err != nil || lr.Hits != lead {
						failW(fmt.Errorf("session %d: lookup: %d hits %v, want %d", i, lr.Hits, err, lead))
						return
					}
				default:
					j := w.rng.IntN(own)
					ok, err := s.Delete(ctx, w.own[j])
					if err != nil || ok != w.stored[j] {
						failW(fmt.Errorf("session %d: delete %d: present=%v err=%v, want %v", i, j, ok, err, w.stored[j]))
						return
					}
					w.stored[j] = false
				}
				ops.Add(1)
			}
		}()
	}

	// Sample every second.
	dur := *soakDuration
	warm := max(time.Second, dur/5)
	t0 := time.Now()
	var rss0, rssMax, rssWarm int64
	gMax := 0.0
	last, lastT := int64(0), t0
	var rates []float64
	rss0 = procStatus(t, d.pid(), "VmRSS")["VmRSS"]
	t.Logf("%6s %10s %10s %10s %10s %6s", "t", "ops/s", "VmRSS", "RssAnon", "RssShmem", "gorout")
	tick := time.NewTicker(time.Second)
	for !stop.Load() && time.Since(t0) < dur {
		select {
		case <-tick.C:
		case <-time.After(time.Until(t0.Add(dur))):
		}
		now, n := time.Now(), ops.Load()
		rate := float64(n-last) / now.Sub(lastT).Seconds()
		last, lastT = n, now
		ps := procStatus(t, d.pid(), "VmRSS", "RssAnon", "RssShmem")
		g := scrapeGauge(t, addr, "go_goroutines")
		t.Logf("%5.1fs %10.0f %9.1fM %9.1fM %9.1fM %6.0f", now.Sub(t0).Seconds(), rate,
			float64(ps["VmRSS"])/(1<<20), float64(ps["RssAnon"])/(1<<20), float64(ps["RssShmem"])/(1<<20), g)
		rates = append(rates, rate)
		gMax = max(gMax, g)
		if now.Sub(t0) < warm+200*time.Millisecond { // the sample at the end of the warm-up is the reference
			rssWarm = ps["VmRSS"]
		} else {
			rssMax = max(rssMax, ps["VmRSS"])
		}
	}
	tick.Stop()
	stop.Store(true)
	wg.Wait()
	el := time.Since(t0)
	if len(bad) > 0 {
		t.Fatalf("%d errors, first: %v", len(bad), bad[0])
	}
	total := ops.Load()
	minRate, maxRate := rates[0], rates[0]
	for _, r := range rates {
		minRate, maxRate = min(minRate, r), max(maxRate, r)
	}
	t.Logf("%d sessions (%d at peak, %d reopens): %d ops in %v = %.0f ops/s (per-second min %.0f, max %.0f), 0 errors",
		nSess, peakSessions, reopens.Load(), total, el.Round(time.Millisecond), float64(total)/el.Seconds(), minRate, maxRate)
	if rssWarm == 0 {
		rssWarm = rss0
	}
	if rssMax == 0 {
		rssMax = rssWarm
	}
	growth := float64(rssMax-rssWarm) / float64(rssWarm)
	t.Logf("daemon VmRSS: %.1f MiB at start of load, %.1f MiB after warm-up (%v), max %.1f MiB after: growth %+.1f%%",
		float64(rss0)/(1<<20), float64(rssWarm)/(1<<20), warm, float64(rssMax)/(1<<20), 100*growth)
	if growth >= 0.20 {
		t.Errorf("daemon RSS grew %.1f%% after warm-up", 100*growth)
	}

	// Close every session: goroutines back to the pre-session count.
	for _, w := range ws {
		w.s.Close()
	}
	for _, c := range clients {
		c.Close()
	}
	t1 := time.Now()
	g := scrapeGauge(t, addr, "go_goroutines")
	for g > goroutines0 && time.Since(t1) < 5*time.Second {
		time.Sleep(20 * time.Millisecond)
		g = scrapeGauge(t, addr, "go_goroutines")
	}
	t.Logf("daemon goroutines: %.0f before any session, max %.0f under load, %.0f after the sessions closed (%v)",
		goroutines0, gMax, g, time.Since(t1).Round(time.Millisecond))
	if g > goroutines0 {
		t.Errorf("daemon goroutines %.0f after the sessions closed, %.0f before", g, goroutines0)
	}

	// Delete the load's blocks: the tier is back to its pre-load figures.
	s := open(t, admin, ns)
	for i := range nSess {
		if _, err := s.DeleteBatch(ctx, chain(uint64(12000+i), own)); err != nil {
			t.Fatal(err)
		}
	}
	st := stats(t, admin)
	x := st.Tiers[0]
	if x.Reserved != b0.Reserved || x.Leased != b0.Leased || x.UsedBytes != b0.UsedBytes || x.Blocks != b0.Blocks || x.Evictions != b0.Evictions {
		t.Errorf("after the soak: reserved %d leased %d used %d blocks %d evictions %d; before %d %d %d %d %d",
			x.Reserved, x.Leased, x.UsedBytes, x.Blocks, x.Evictions, b0.Reserved, b0.Leased, b0.UsedBytes, b0.Blocks, b0.Evictions)
	}
	if st.SessionsBad != 0 {
		t.Errorf("%d sessions closed as hostile", st.SessionsBad)
	}
	s.Close()
	admin.Close()
	if err := d.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
}
