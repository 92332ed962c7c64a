package shm

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// heapRings builds a daemon view (init) and a client view over the same
// ordinary memory; the ring code does not care where its bytes live.
func heapRings(tb testing.TB, l RingLayout) (client, daemon *Ring) {
	tb.Helper()
	mem := make([]byte, l.Size())
	d, err := NewRing(mem, l, true)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := NewRing(mem, l, false)
	if err != nil {
		tb.Fatal(err)
	}
	return c, d
}

func TestNewRingRejects(t *testing.T) {
	l := RingLayout{Entries: 16, DataSize: 4096}
	if _, err := NewRing(make([]byte, l.Size()-1), l, true); !errors.Is(err, ErrRingCorrupt) {
		t.Fatalf("short region: %v", err)
	}
	if _, err := NewRing(make([]byte, 1<<20), RingLayout{Entries: 7}, true); !errors.Is(err, ErrRingCorrupt) {
		t.Fatalf("bad layout: %v", err)
	}
	// A client view over an uninitialised region (no magic).
	if _, err := NewRing(make([]byte, l.Size()), l, false); !errors.Is(err, ErrRingCorrupt) {
		t.Fatalf("no magic: %v", err)
	}
	mem := make([]byte, l.Size())
	if _, err := NewRing(mem, l, true); err != nil {
		t.Fatal(err)
	}
	// The announced layout disagrees with the header.
	if _, err := NewRing(mem, RingLayout{Entries: 8, DataSize: 4096}, false); !errors.Is(err, ErrRingCorrupt) {
		t.Fatalf("entries mismatch: %v", err)
	}
	r, err := NewRing(mem, l, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.Layout() != l || len(r.Data()) != int(l.DataSize) || cap(r.Data()) != int(l.DataSize) {
		t.Fatalf("layout %+v data %d/%d", r.Layout(), len(r.Data()), cap(r.Data()))
	}
	if &r.Data()[0] != &mem[l.DataOff()] {
		t.Fatal("Data does not start at DataOff")
	}
}

func TestRingPushPop(t *testing.T) {
	l := RingLayout{Entries: 8, DataSize: 0}
	c, d := heapRings(t, l)
	if c.ClientSQSpace() != 8 {
		t.Fatalf("space %d", c.ClientSQSpace())
	}
	es := make([]SQE, 10)
	for i := range es {
		es[i] = SQE{Op: OpNop, UserData: uint64(i)}
	}
	if n := c.ClientPush(es); n != 8 {
		t.Fatalf("pushed %d into an 8-entry ring", n)
	}
	if c.ClientSQSpace() != 0 || c.ClientPush(es[8:]) != 0 {
		t.Fatal("full ring accepted more")
	}
	if !d.DaemonPending() {
		t.Fatal("daemon sees nothing pending")
	}
	got := make([]SQE, 5)
	n, err := d.DaemonPop(got)
	if err != nil || n != 5 {
		t.Fatalf("DaemonPop = %d, %v", n, err)
	}
	for i := 0; i < n; i++ {
		if got[i] != es[i] {
			t.Fatalf("entry %d = %+v", i, got[i])
		}
	}
	if c.ClientSQSpace() != 5 {
		t.Fatalf("space after pop %d", c.ClientSQSpace())
	}
	// Wrap around the ring's slots.
	if n := c.ClientPush(es[8:]); n != 2 {
		t.Fatalf("pushed %d", n)
	}
	got = make([]SQE, 16)
	n, err = d.DaemonPop(got)
	if err != nil || n != 5 {
		t.Fatalf("DaemonPop = %d, %v", n, err)
	}
	for i := 0; i < n; i++ {
		if got[i].UserData != uint64(5+i) {
			t.Fatalf("entry %d user_data %d", i, got[i].UserData)
		}
	}
	if d.DaemonPending() {
		t.Fatal("pending after draining")
	}

	space, err := d.DaemonCQSpace()
	if err != nil || space != 8 {
		t.Fatalf("DaemonCQSpace = %d, %v", space, err)
	}
	cs := []CQE{{UserData: 1, Value: 2, Offset: 3, Status: StatusExists, Tier: TierNVMe}, {UserData: 9}}
	d.DaemonPush(cs)
	if !c.ClientPending() {
		t.Fatal("client sees no completions")
	}
	if space, _ := d.DaemonCQSpace(); space != 6 {
		t.Fatalf("space %d", space)
	}
	gc := make([]CQE, 1)
	if c.ClientPop(gc) != 1 || gc[0] != cs[0] {
		t.Fatalf("ClientPop %+v", gc)
	}
	if c.ClientPop(gc) != 1 || gc[0] != cs[1] || c.ClientPending() || c.ClientPop(gc) != 0 {
		t.Fatal("second completion")
	}
}

// TestRingIndexWrap runs the rings across the uint32 index overflow.
func TestRingIndexWrap(t *testing.T) {
	l := RingLayout{Entries: 8}
	c, d := heapRings(t, l)
	start := uint32(math.MaxUint32 - 20)
	c.localSQ, c.localCQ = start, start
	d.localSQ, d.localCQ = start, start
	c.sqTail.Store(start)
	d.sqHead.Store(start)
	d.cqTail.Store(start)
	c.cqHead.Store(start)

	next := uint64(0)
	want := uint64(0)
	for round := 0; round < 20; round++ {
		es := make([]SQE, 5)
		for i := range es {
			es[i] = SQE{Op: OpNop, UserData: next}
			next++
		}
		if n := c.ClientPush(es); n != 5 {
			t.Fatalf("round %d: pushed %d", round, n)
		}
		got := make([]SQE, 8)
		n, err := d.DaemonPop(got)
		if err != nil || n != 5 {
			t.Fatalf("round %d: DaemonPop = %d, %v", round, n, err)
		}
		cs := make([]CQE, n)
		for i := 0; i < n; i++ {
			cs[i].UserData = got[i].UserData
		}
		if space, err := d.DaemonCQSpace(); err != nil || space != 8 {
			t.Fatalf("round %d: DaemonCQSpace = %d, %v", round, space, err)
		}
		d.DaemonPush(cs)
		gc := make([]CQE, 8)
		if m := c.ClientPop(gc); m != 5 {
			t.Fatalf("round %d: ClientPop = %d", round, m)
		}
		for i := 0; i < 5; i++ {
			if gc[i].UserData != want {
				t.Fatalf("round %d: completion %d, want %d", round, gc[i].UserData, want)
			}
			want++
		}
	}
	if c.localSQ >= start {
		t.Fatal("indices did not wrap")
	}
}

func TestRingDaemonPopCorrupt(t *testing.T) {
	l := RingLayout{Entries: 8}
	for _, tc := range []struct {
		name string
		head uint32 // daemon's private head
		tail uint32 // what the client publishes
		ok   bool
	}{
		{"exactly full", 0, 8, true},
		{"tail one past full", 0, 9, false},
		{"tail far beyond", 0, 1 << 31, false},
		{"tail behind head", 5, 4, false},
		{"tail max", 0, math.MaxUint32, false},
		{"full across wrap", math.MaxUint32 - 3, 4, true},
		{"past full across wrap", math.MaxUint32 - 3, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, d := heapRings(t, l)
			d.localSQ = tc.head
			c.sqTail.Store(tc.tail)
			n, err := d.DaemonPop(make([]SQE, 16))
			if tc.ok {
				if err != nil || n != 8 {
					t.Fatalf("DaemonPop = %d, %v", n, err)
				}
				return
			}
			if !errors.Is(err, ErrRingCorrupt) || n != 0 {
				t.Fatalf("DaemonPop = %d, %v; want ErrRingCorrupt", n, err)
			}
			if d.localSQ != tc.head {
				t.Fatal("head moved")
			}
		})
	}
}

func TestRingDaemonCQSpaceCorrupt(t *testing.T) {
	l := RingLayout{Entries: 8}
	for _, tc := range []struct {
		name       string
		tail, head uint32
		space      int
	}{
		{"empty", 0, 0, 8},
		{"full", 8, 0, 0},
		{"head beyond tail", 0, 1, -1},
		{"head far beyond tail", 3, 1 << 30, -1},
		{"head too far behind", 9, 0, -1},
		{"wrap", 2, math.MaxUint32 - 1, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, d := heapRings(t, l)
			d.localCQ = tc.tail
			c.cqHead.Store(tc.head)
			space, err := d.DaemonCQSpace()
			if tc.space < 0 {
				if !errors.Is(err, ErrRingCorrupt) || space != 0 {
					t.Fatalf("DaemonCQSpace = %d, %v; want ErrRingCorrupt", space, err)
				}
				return
			}
			if err != nil || space != tc.space {
				t.Fatalf("DaemonCQSpace = %d, %v; want %d", space, err, tc.space)
			}
		})
	}
}

// The client does not trust the daemon either: impossible indices make it
// push or pop nothing rather than overrun.
func TestRingClientIgnoresImpossibleIndices(t *testing.T) {
	l := RingLayout{Entries: 8}
	c, d := heapRings(t, l)
	d.sqHead.Store(3) // head beyond the client's tail (0)
	if n := c.ClientPush(make([]SQE, 4)); n != 0 {
		t.Fatalf("ClientPush with head past tail = %d", n)
	}
	d.sqHead.Store(0)
	d.cqTail.Store(9) // more completions than the ring holds
	if n := c.ClientPop(make([]CQE, 16)); n != 0 {
		t.Fatalf("ClientPop with tail past full = %d", n)
	}
	d.cqTail.Store(math.MaxUint32) // tail behind head
	if n := c.ClientPop(make([]CQE, 16)); n != 0 {
		t.Fatalf("ClientPop with tail behind head = %d", n)
	}
}

// A peer may set or clear the sleep flags and bump the sequence words at
// will; a wait must still end within its bound.
func TestRingWaitBoundedUnderHostilePeer(t *testing.T) {
	l := RingLayout{Entries: 8}
	const bound = 20 * time.Millisecond
	slack := 250 * time.Millisecond // -race on a loaded two-core machine
	for _, mode := range []string{"flag forced 1", "flag forced 0", "flag flapping", "seq churn"} {
		t.Run(mode, func(t *testing.T) {
			c, d := heapRings(t, l)
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; !stop.Load(); i++ {
					switch mode {
					case "flag forced 1":
						c.sqSleep.Store(1)
						c.cqSleep.Store(1)
					case "flag forced 0":
						c.sqSleep.Store(0)
						c.cqSleep.Store(0)
					case "flag flapping":
						c.sqSleep.Store(uint32(i & 1))
						c.cqSleep.Store(uint32(i >> 1 & 1))
					case "seq churn":
						c.sqSeq.Add(1)
						c.cqSeq.Add(1)
					}
					if i&255 == 0 {
						time.Sleep(50 * time.Microsecond)
					}
				}
			}()
			defer func() { stop.Store(true); wg.Wait() }()
			for i := 0; i < 5; i++ {
				t0 := time.Now()
				d.DaemonWait(0, bound)
				if el := time.Since(t0); el > bound+slack {
					t.Fatalf("DaemonWait took %v, bound %v", el, bound)
				}
				t0 = time.Now()
				c.ClientWait(time.Millisecond, bound, nil)
				if el := time.Since(t0); el > bound+time.Millisecond+slack {
					t.Fatalf("ClientWait took %v, bound %v", el, bound)
				}
			}
			// Waking a peer whose flag was forced must not block either.
			c.ClientWake()
			d.DaemonPush([]CQE{{UserData: 1}})
		})
	}
}

func TestRingWaitReturnsWhenReady(t *testing.T) {
	c, d := heapRings(t, RingLayout{Entries: 8})
	c.ClientPush([]SQE{{Op: OpNop}})
	t0 := time.Now()
	d.DaemonWait(0, 10*time.Second)
	if el := time.Since(t0); el > time.Second {
		t.Fatalf("DaemonWait with an entry pending took %v", el)
	}
	if d.sqSleep.Load() != 0 {
		t.Fatal("sleep flag left set")
	}
}

// TestRingWaitMore: a wait returns when more reports work, whether the
// work (and its interrupt) came before the wait, during its spin or during
// its sleep; with more, an interrupt is never slept through. Both sides.
func TestRingWaitMore(t *testing.T) {
	c, d := heapRings(t, RingLayout{Entries: 8})
	var p Pacer
	for _, side := range []struct {
		name      string
		wait      func(spin time.Duration, more func() bool)
		interrupt func()
	}{
		{"daemon", func(spin time.Duration, more func() bool) { d.DaemonWaitPaced(spin, &p, 10*time.Second, more) }, d.DaemonInterrupt},
		{"client", func(spin time.Duration, more func() bool) { c.ClientWait(spin, 10*time.Second, more) }, c.ClientInterrupt},
	} {
		t.Run(side.name, func(t *testing.T) {
			var work atomic.Bool
			more := func() bool { return work.Load() }
			work.Store(true)
			t0 := time.Now()
			side.wait(0, more)
			if el := time.Since(t0); el > time.Second {
				t.Fatalf("wait with work already there took %v", el)
			}
			for i := range 2000 {
				work.Store(false)
				delay := time.Duration(i%50) * time.Microsecond
				go func() {
					if delay > 0 {
						time.Sleep(delay)
					}
					work.Store(true)
					side.interrupt()
				}()
				t0 := time.Now()
				for !work.Load() { // a wake-up of an earlier round may end a wait early
					side.wait(time.Duration(i%3)*10*time.Microsecond, more)
					if el := time.Since(t0); el > 5*time.Second {
						t.Fatalf("round %d (work after %v): the wait slept through it for %v", i, delay, el)
					}
				}
			}
		})
	}
}

func TestRingInterrupt(t *testing.T) {
	c, d := heapRings(t, RingLayout{Entries: 8})
	for _, side := range []struct {
		name      string
		wait      func()
		interrupt func()
	}{
		{"daemon", func() { d.DaemonWait(0, 10*time.Second) }, d.DaemonInterrupt},
		{"client", func() { c.ClientWait(0, 10*time.Second, nil) }, c.ClientInterrupt},
	} {
		done := make(chan time.Duration)
		go func() {
			t0 := time.Now()
			side.wait()
			done <- time.Since(t0)
		}()
		// Interrupts are not sticky: one that lands before the waiter
		// read the sequence word is missed, so keep ringing.
		tick := time.NewTicker(5 * time.Millisecond)
	loop:
		for {
			select {
			case el := <-done:
				if el > 5*time.Second {
					t.Fatalf("%s wait took %v", side.name, el)
				}
				break loop
			case <-tick.C:
				side.interrupt()
			}
		}
		tick.Stop()
	}
}

// TestDaemonSpin: the spin alone reports work that comes during it (a
// submission, or more), and gives up after its time without sleeping.
func TestDaemonSpin(t *testing.T) {
	c, d := heapRings(t, RingLayout{Entries: 8})
	var p Pacer
	t0 := time.Now()
	if d.DaemonSpin(2*time.Millisecond, &p, nil) {
		t.Fatal("spin reported work on an empty ring")
	}
	if el := time.Since(t0); el > time.Second {
		t.Fatalf("a 2 ms spin took %v", el)
	}
	go func() {
		time.Sleep(time.Millisecond)
		c.ClientPush([]SQE{{Op: OpNop, UserData: 1}})
	}()
	if !d.DaemonSpin(10*time.Second, &p, nil) {
		t.Fatal("spin missed a submission")
	}
	var more atomic.Bool
	go func() {
		time.Sleep(time.Millisecond)
		more.Store(true)
	}()
	buf := make([]SQE, 8)
	d.DaemonPop(buf) // the submission above
	if !d.DaemonSpin(10*time.Second, &p, more.Load) {
		t.Fatal("spin missed its more condition")
	}
}

// TestRingString: the diagnostic view shows both sides' shared words as
// each side moved them, whichever side prints it.
func TestRingString(t *testing.T) {
	c, d := heapRings(t, RingLayout{Entries: 8})
	c.ClientPush(make([]SQE, 5))
	got := make([]SQE, 3)
	if n, err := d.DaemonPop(got); n != 3 || err != nil {
		t.Fatalf("pop %d, %v", n, err)
	}
	d.DaemonPush(make([]CQE, 2))
	d.DaemonInterrupt()
	want := "sq tail 5 head 3 sleep 0 seq 1; cq tail 2 head 0 sleep 0 seq 0 room 0"
	for name, r := range map[string]*Ring{"client": c, "daemon": d} {
		if s := r.String(); s != want {
			t.Errorf("%s view: %q, want %q", name, s, want)
		}
	}
}
