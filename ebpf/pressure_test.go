package ebpf

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fakeSource replays pressure samples (percent).
type fakeSource struct {
	mu sync.Mutex
	p  float64
}

func (f *fakeSource) Name() string { return "fake" }
func (f *fakeSource) set(p float64) {
	f.mu.Lock()
	f.p = p
	f.mu.Unlock()
}
func (f *fakeSource) Pressure(time.Duration) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.p, nil
}

// fakeChain scales its configured watermarks (cfgHigh, cfgLow) by the
// pressure ratio as tiers.Chain does; high and low are the effective ones.
type fakeChain struct {
	cfgHigh, cfgLow float64
	high, low       float64
	ratio           float64
}

func newFakeChain(high, low float64) *fakeChain {
	return &fakeChain{cfgHigh: high, cfgLow: low, high: high, low: low, ratio: 1}
}

func (c *fakeChain) Watermarks() (float64, float64) { return c.high, c.low }
func (c *fakeChain) SetPressureRatio(r float64) error {
	c.ratio = r
	c.high, c.low = c.cfgHigh*r, c.cfgLow*r
	return nil
}

// reload changes the configured watermarks (a SIGHUP).
func (c *fakeChain) reload(high, low float64) {
	c.cfgHigh, c.cfgLow = high, low
	c.SetPressureRatio(c.ratio)
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestControllerHysteresis drives the controller with a faked signal: it
// shrinks by one step per pressured sample down to Min, holds in the band
// between Low and High, and grows back one step per Calm quiet samples.
func TestControllerHysteresis(t *testing.T) {
	src := &fakeSource{}
	ch := newFakeChain(0.9, 0.8)
	c := NewController(ControllerConfig{High: 10, Low: 2, Calm: 3, Step: 0.25, Min: 0.5}, src, ch, "", nil)

	src.set(1)
	c.Step()
	if s := c.State(); s.TargetRatio != 1 || ch.high != 0.9 {
		t.Fatalf("no pressure: ratio %v high %v", s.TargetRatio, ch.high)
	}
	src.set(30)
	c.Step()
	if s := c.State(); s.TargetRatio != 0.75 || !near(ch.high, 0.675) || !near(ch.low, 0.6) {
		t.Fatalf("after one pressured sample: ratio %v watermarks %v/%v", s.TargetRatio, ch.high, ch.low)
	}
	for range 5 {
		c.Step()
	}
	if s := c.State(); s.TargetRatio != 0.5 || !near(ch.high, 0.45) {
		t.Fatalf("sustained pressure: ratio %v high %v, want the floor 0.5", s.TargetRatio, ch.high)
	}
	// In the band: hold, and the calm count restarts.
	src.set(5)
	for range 10 {
		c.Step()
	}
	if c.State().TargetRatio != 0.5 {
		t.Fatalf("pressure between Low and High changed the target to %v", c.State().TargetRatio)
	}
	src.set(0)
	c.Step()
	c.Step()
	if c.State().TargetRatio != 0.5 {
		t.Fatal("grew before Calm quiet samples")
	}
	c.Step()
	if c.State().TargetRatio != 0.75 {
		t.Fatalf("after Calm quiet samples ratio %v, want 0.75", c.State().TargetRatio)
	}
	for range 3 {
		c.Step()
	}
	if s := c.State(); s.TargetRatio != 1 || !near(ch.high, 0.9) || !near(ch.low, 0.8) {
		t.Fatalf("pressure gone: ratio %v watermarks %v/%v, want the configured 0.9/0.8", s.TargetRatio, ch.high, ch.low)
	}
	if s := c.State(); s.Shrinks != 2 || s.Grows != 2 {
		t.Fatalf("shrinks %d grows %d, want 2 and 2", s.Shrinks, s.Grows)
	}
	// A reload while unpressured becomes the base.
	ch.reload(0.8, 0.6)
	src.set(50)
	c.Step()
	if !near(ch.high, 0.6) || !near(ch.low, 0.45) {
		t.Fatalf("base after reload: watermarks %v/%v, want 0.6/0.45", ch.high, ch.low)
	}
	// A reload under pressure is kept, scaled by the pressure target.
	ch.reload(0.4, 0.2)
	if !near(ch.high, 0.3) || !near(ch.low, 0.15) || c.State().TargetRatio != 0.75 {
		t.Fatalf("reload under pressure: watermarks %v/%v ratio %v, want 0.3/0.15 at 0.75", ch.high, ch.low, c.State().TargetRatio)
	}
}

func TestPSISource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "memory")
	write := func(total int) {
		s := "some avg10=12.50 avg60=3.00 avg300=1.00 total=" + itoa(total) +
			"\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(1000)
	s, err := ReadPSI(path)
	if err != nil || s.SomeAvg10 != 12.5 || s.SomeTotal != 1000 {
		t.Fatalf("ReadPSI = %+v, %v", s, err)
	}
	p := &PSI{Path: path}
	if v, _ := p.Pressure(time.Second); v != 12.5 {
		t.Fatalf("first sample %v, want avg10 12.5", v)
	}
	write(1000 + 250_000) // 250 ms stalled in a 1 s interval
	if v, _ := p.Pressure(time.Second); !near(v, 25) {
		t.Fatalf("pressure %v, want 25", v)
	}
	os.WriteFile(path, []byte("garbage\n"), 0o600)
	if _, err := p.Pressure(time.Second); err == nil {
		t.Fatal("no error for a malformed file")
	}
}

func itoa(v int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + v%10)}, b...)
		v /= 10
		if v == 0 {
			return string(b)
		}
	}
}

type fakeReclaim struct{ s ReclaimStats }

func (f *fakeReclaim) Read() (ReclaimStats, error) { return f.s, nil }

func TestReclaimSource(t *testing.T) {
	f := &fakeReclaim{}
	r := &ReclaimSource{Probe: f}
	r.Pressure(time.Second)
	f.s = ReclaimStats{Stalls: 3, StallTime: 300 * time.Millisecond}
	if v, _ := r.Pressure(time.Second); !near(v, 30) {
		t.Fatalf("pressure %v, want 30", v)
	}
	f.s.StallTime += 5 * time.Second
	if v, _ := r.Pressure(time.Second); v != 100 {
		t.Fatalf("pressure %v, want capped at 100", v)
	}
}

func TestCumulative(t *testing.T) {
	var h Histogram
	h.Slots[3] = 2   // < 1 µs: folds into the first bucket
	h.Slots[10] = 5  // [1.024, 2.048) µs
	h.Slots[20] = 1  // ~1 ms
	h.Slots[50] = 1  // beyond the last bucket: only in +Inf (count)
	h.SumNs = 123456 // not checked against the slots
	count, sum, b := h.Cumulative()
	if count != 9 || !near(sum, 123456e-9) {
		t.Fatalf("count %d sum %v", count, sum)
	}
	if len(b) != maxSlot-minSlot+1 {
		t.Fatalf("%d buckets", len(b))
	}
	for le, want := range map[float64]uint64{1.024e-6: 2, 2.048e-6: 7, 1.048576e-3: 7, 2.097152e-3: 8, math.Ldexp(1, maxSlot+1) * 1e-9: 8} {
		if b[le] != want {
			t.Errorf("bucket le=%v: %d, want %d", le, b[le], want)
		}
	}
}

// TestControllerLateSample: a sample taken late (the ticker fired late: the
// daemon was stalled, as it is under memory pressure) spans more than one
// interval of stall time, and must be measured against the time it spans.
// Measured against the nominal interval, 5% pressure over 200 ms read as
// 100% and shrank the host tier.
func TestControllerLateSample(t *testing.T) {
	path := filepath.Join(t.TempDir(), "memory")
	write := func(total int) {
		s := "some avg10=0.00 avg60=0.00 avg300=0.00 total=" + itoa(total) +
			"\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(1000)
	ch := newFakeChain(0.9, 0.8)
	c := NewController(ControllerConfig{Interval: 10 * time.Millisecond}, &PSI{Path: path}, ch, "", nil)
	c.Step() // the first sample primes the source
	const late = 200 * time.Millisecond
	time.Sleep(late)                          // only makes the sample later; the check holds for any delay
	write(1000 + int(late.Microseconds()/20)) // stalled 5% of the time
	c.Step()
	if st := c.State(); st.Pressure > 5 || st.Shrinks != 0 || ch.ratio != 1 {
		t.Fatalf("a sample 200ms late with 5%% stall time read %.1f%% pressure and shrank %d times (ratio %v); want <= 5%%, no shrink",
			st.Pressure, st.Shrinks, ch.ratio)
	}
}

// TestPSIOddContent: a pressure file is outside input (a container's
// virtualized /proc can serve anything). Values that are not a share of
// time are an error, and a total that goes backwards (another file behind
// the path) is no pressure, not a wrapped one. Before, avg10=NaN reached
// the status, whose JSON then failed to encode (kvtierctl status broke),
// and a smaller total read as negative pressure.
func TestPSIOddContent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "memory")
	write := func(some string) {
		if err := os.WriteFile(path, []byte(some+"\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{
		"some avg10=NaN avg60=0.00 avg300=0.00 total=5",
		"some avg10=+Inf avg60=0.00 avg300=0.00 total=5",
		"some avg10=-Inf avg60=0.00 avg300=0.00 total=5",
		"some avg10=-1.00 avg60=0.00 avg300=0.00 total=5",
		"some avg10=100.01 avg60=0.00 avg300=0.00 total=5",
	} {
		write(bad)
		if s, err := ReadPSI(path); err == nil {
			t.Errorf("ReadPSI(%q) = %+v, want an error", bad, s)
		}
		c := NewController(ControllerConfig{}, &PSI{Path: path}, newFakeChain(0.9, 0.8), path, nil)
		c.Step()
		if _, err := json.Marshal(c.State()); err != nil {
			t.Errorf("%q: controller state does not encode: %v", bad, err)
		}
	}

	p := &PSI{Path: path}
	write("some avg10=0.00 avg60=0.00 avg300=0.00 total=5000000")
	p.Pressure(time.Second)
	write("some avg10=0.00 avg60=0.00 avg300=0.00 total=1000") // went backwards
	if v, err := p.Pressure(time.Second); err != nil || v < 0 || v > 100 {
		t.Fatalf("pressure after the total went backwards: %v, %v; want 0..100", v, err)
	}
	write("some avg10=0.00 avg60=0.00 avg300=0.00 total=251000") // counts from the new total
	if v, err := p.Pressure(time.Second); err != nil || !near(v, 25) {
		t.Fatalf("pressure %v, %v; want 25", v, err)
	}
}

// TestControllerStopReportsRestoredRatio: when Run ends (the daemon
// stops) it sets the chain's pressure ratio back to 1; its state, which
// status and kvtier_host_target_ratio show while the daemon drains, said
// the old shrunken target.
func TestControllerStopReportsRestoredRatio(t *testing.T) {
	src := &fakeSource{}
	ch := newFakeChain(0.9, 0.8)
	c := NewController(ControllerConfig{Step: 0.25}, src, ch, "", nil)
	src.set(50)
	c.Step()
	if ch.ratio != 0.75 {
		t.Fatalf("pressured sample: chain ratio %v, want 0.75", ch.ratio)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.Run(ctx)
	if s := c.State(); ch.ratio != 1 || s.TargetRatio != ch.ratio {
		t.Fatalf("after Run: chain ratio %v, state says %v", ch.ratio, s.TargetRatio)
	}
}
