package shm

import (
	"testing"
	"time"
)

// TestSpinnerBudget: an unanswered spin gives up after its budget and
// within the wall-clock cap.
func TestSpinnerBudget(t *testing.T) {
	const budget = 200 * time.Microsecond
	for i := range 6 {
		p := Pacer{Yielding: i%2 == 1}
		var s Spinner
		t0 := time.Now()
		s.Reset(budget, &p)
		n := 0
		for s.Pause() {
			n++
		}
		el := time.Since(t0)
		if el < budget && !p.Yielding { // a Yielding spin may stop early
			t.Fatalf("gave up after %v (%d polls), budget %v", el, n, budget)
		}
		// The cap plus slack for a descheduled test process.
		if limit := spinWallFactor*budget + 100*time.Millisecond; el > limit {
			t.Fatalf("spun %v, cap %v", el, limit)
		}
		if s.Pause() {
			t.Fatal("Pause true after the budget was spent")
		}
	}
}

// TestSpinnerZero: a zero budget never spins.
func TestSpinnerZero(t *testing.T) {
	var s Spinner
	s.Reset(0, nil)
	if s.Pause() {
		t.Fatal("Pause true with a zero budget")
	}
}

// TestPacerLearn: idle yields back off up to the cap; a used one resets.
func TestPacerLearn(t *testing.T) {
	var p Pacer
	want := []uint32{2, 4, 8, 16, 32, 64, 64}
	for i, w := range want {
		learn(&p.osEvery, true)
		if got := p.osEvery.Load(); got != w {
			t.Fatalf("step %d: every %d, want %d", i, got, w)
		}
	}
	if !yieldDue(&p.osEvery, 128) || yieldDue(&p.osEvery, 65) {
		t.Fatal("yieldDue ignores the interval")
	}
	learn(&p.osEvery, false)
	if got := p.osEvery.Load(); got != 1 {
		t.Fatalf("after a used yield every %d, want 1", got)
	}
	if !yieldDue(&p.goEvery, 1) {
		t.Fatal("zero Pacer must yield at every pause")
	}
}

// TestPacerHot: a waiter whose peer answers almost every wait within the
// quick window becomes hot; a few slow waits (the peer went to copy a block,
// or went idle) cool it again.
func TestPacerHot(t *testing.T) {
	var p Pacer
	if p.Hot() {
		t.Fatal("zero Pacer is hot")
	}
	for range 16 {
		p.observeQuick(true)
	}
	if !p.Hot() {
		t.Fatalf("not hot after 16 quick waits (level %d)", p.quick.Load())
	}
	// Alternating quick and slow waits (a client copying a block after every
	// other request) never make a cold pacer hot.
	var q Pacer
	for i := range 64 {
		q.observeQuick(i%2 == 0)
		if q.Hot() {
			t.Fatalf("hot after %d alternating waits (level %d)", i+1, q.quick.Load())
		}
	}
	n := 0
	for p.Hot() {
		p.observeQuick(false)
		n++
	}
	if n > 3 {
		t.Fatalf("still hot after %d slow waits", n-1)
	}
}

func TestPollQuick(t *testing.T) {
	var p Pacer
	calls := 0
	if !p.pollQuick(func() bool { calls++; return calls == 3 }) {
		t.Fatal("pollQuick missed an entry that arrived on the third poll")
	}
	t0 := time.Now()
	if p.pollQuick(func() bool { return false }) {
		t.Fatal("pollQuick reported an entry that never came")
	}
	if el := time.Since(t0); el < quickWindow {
		t.Fatalf("gave up after %v, window %v", el, quickWindow)
	}
}

// TestPacerShare: a spin whose Pacer says nobody else needs a P never
// yields to the Go scheduler (so it never learns a Gosched interval); one
// that shares does, as paced.
func TestPacerShare(t *testing.T) {
	for _, share := range []bool{false, true} {
		asked := 0
		p := Pacer{Share: func() bool { asked++; return share }}
		var s Spinner
		s.Reset(300*time.Microsecond, &p)
		for s.Pause() {
		}
		if asked == 0 {
			t.Fatalf("share=%v: Share never consulted", share)
		}
		// goEvery changes only through learn, after a Gosched.
		if got := p.goEvery.Load(); (got != 0) != share {
			t.Fatalf("share=%v: Gosched interval %d after the spin", share, got)
		}
	}
}
