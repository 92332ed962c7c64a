package shm

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Spinner paces a poll loop that waits for the peer process.
//
// Every pauseEvery polls it may yield twice: to this process's other
// goroutines (runtime.Gosched: with more sessions than Ps, another caller
// has a block to copy) and to other threads queued on this CPU
// (sched_yield: the peer that must answer the poll may be one of them, and
// while we poll it cannot run). Only the time spent polling counts against
// the budget, not time that others used the CPU during a yield, so a waiter
// keeps polling while its CPU does useful work instead of falling back to
// the futex, whose wake-up (tens of microseconds on virtual machines) lands
// on a busy CPU. The wall time is capped too, so a waiter on a loaded
// machine still goes to sleep.
//
// Yields are not free when nobody needs the CPU: Gosched with an idle P
// wakes an idle thread of the Go runtime, which then competes for the CPU,
// and a sched_yield costs a system call. So each kind backs off (doubling
// its interval) while it comes back at once, and resets to every pause
// when it did not; the Pacer carries what was learned from one wait to the
// next.
type Spinner struct {
	p     *Pacer
	left  time.Duration // polling time still allowed
	last  time.Time     // end of the last yield
	until time.Time     // wall-clock cap
	n     uint32
	busy  int // yields that let another thread run
}

// Pacer is the yield pacing a Spinner learns: how many pauses pass between
// yields of each kind. Keep one per waiter (a session's ring loop, a
// client connection); the zero value yields at every pause. Safe for
// concurrent use.
type Pacer struct {
	// Yielding stops the spin as soon as a sched_yield let another thread
	// run: the CPU is not idle, and a spinner that yields again and again
	// sinks in the kernel's order (each sched_yield pushes its deadline a
	// slice further), so it would answer late; sleeping on the futex gives
	// the CPU away and is woken with a fresh slice.
	Yielding bool

	// Share, when set, reports whether other goroutines of this process
	// may be waiting for a P; while it returns false the spinner never
	// calls runtime.Gosched. A Gosched puts the spinner on the global run
	// queue and wakes an idle P's thread to look for work, which then takes
	// CPU time from the spinner (and from the peer) only to find this one
	// goroutine again: a daemon with fewer ring loops than Ps measured
	// Commit and Delete round trips of 2–14 µs at the median with it and
	// 1.5–1.9 µs without (docs/benchmarks.md, "Ring loops yield to the Go
	// scheduler only when crowded"). nil: always share.
	Share func() bool

	goEvery, osEvery atomic.Uint32
	// quick is a moving average (out of quickOne) of how many waits the
	// peer answered within quickWindow; see Hot.
	quick atomic.Uint32
}

const (
	// quickWindow: a wait answered this fast is part of a back-to-back
	// exchange (the peer is polling for our answer and submits again at
	// once). It is well below a futex wake-up, which costs 5-50 µs on
	// virtual machines.
	quickWindow = 4 * time.Microsecond
	quickOne    = 1 << 10
	quickShift  = 3 // moving average over ~8 waits
	// A waiter is hot when 3 of 4 recent waits were quick.
	hotLevel = quickOne * 3 / 4
)

// Hot reports whether the peer has recently answered almost every wait
// within quickWindow: a chatty exchange of small requests (lookups, say), in
// which polling costs little CPU and each sleep would add a wake-up to
// every round trip. A peer that works between requests (copies a block)
// answers half of the waits slowly or more and is not hot.
func (p *Pacer) Hot() bool { return p.quick.Load() >= hotLevel }

// observeQuick folds one wait's outcome into the moving average.
func (p *Pacer) observeQuick(quick bool) {
	q := p.quick.Load()
	q -= q >> quickShift
	if quick {
		q += quickOne >> quickShift
	}
	p.quick.Store(q)
}

// pollQuick polls ready for up to quickWindow and records whether it came
// true within it.
func (p *Pacer) pollQuick(ready func() bool) bool {
	t0 := time.Now()
	for i := 1; ; i++ {
		if ready() {
			p.observeQuick(true)
			return true
		}
		if i%8 == 0 && time.Since(t0) >= quickWindow {
			p.observeQuick(false)
			return false
		}
	}
}

const (
	pauseEvery = 32 // polls per pause
	// spinWallFactor caps a spin at this many budgets of wall time.
	spinWallFactor = 20
	// maxYieldEvery bounds the back-off: with nobody else runnable we still
	// look again after that many pauses (~50 µs of polling).
	maxYieldEvery = 64
	// A yield that took longer than this let someone else run.
	goschedFast = 2 * time.Microsecond
	osYieldFast = 5 * time.Microsecond
)

// Reset starts a spin of budget polling time paced by p (nil: a private
// pacer, learning nothing across spins).
func (s *Spinner) Reset(budget time.Duration, p *Pacer) {
	if p == nil {
		p = new(Pacer)
	}
	now := time.Now()
	*s = Spinner{p: p, left: budget, last: now, until: now.Add(spinWallFactor * budget)}
}

// Pause is called after each unsuccessful poll. It reports false once the
// budget is spent; the caller then sleeps.
func (s *Spinner) Pause() bool {
	if s.left <= 0 {
		return false
	}
	s.n++
	if s.n%pauseEvery != 0 {
		return true
	}
	now := time.Now()
	s.left -= now.Sub(s.last)
	if s.left <= 0 || now.After(s.until) {
		s.left = 0
		return false
	}
	k := s.n / pauseEvery
	if yieldDue(&s.p.goEvery, k) && (s.p.Share == nil || s.p.Share()) {
		runtime.Gosched()
		t := time.Now()
		learn(&s.p.goEvery, t.Sub(now) < goschedFast)
		now = t
	}
	if yieldDue(&s.p.osEvery, k) {
		osYield()
		t := time.Now()
		idle := t.Sub(now) < osYieldFast
		learn(&s.p.osEvery, idle)
		if !idle && s.p.Yielding {
			// Twice: a kernel thread passing through is no contention.
			if s.busy++; s.busy >= 2 {
				s.left = 0
				return false
			}
		}
		now = t
	}
	s.last = now
	return true
}

func yieldDue(every *atomic.Uint32, k uint32) bool {
	return k%max(every.Load(), 1) == 0
}

// learn doubles the interval after a yield nobody used, resets it after one
// that let somebody run.
func learn(every *atomic.Uint32, idle bool) {
	if !idle {
		every.Store(1)
		return
	}
	every.Store(min(max(every.Load(), 1)*2, maxYieldEvery))
}
