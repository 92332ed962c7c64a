package daemon

import (
	"os"
	"runtime"
	"sync"
)

// procSizer raises GOMAXPROCS to the number of live sessions when there
// are more sessions than CPUs.
//
// A ring loop with nothing to do sleeps in a futex system call, and a
// goroutine blocked in a system call keeps its P until sysmon takes it back
// (20 µs to 10 ms later). With more sessions than Ps, the other ring loops
// then wait for a P, and each wake-up costs extra thread hand-offs (retake,
// handoffp, exitsyscall without a P: 12% of the daemon's CPU at 4 sessions
// on 2 CPUs, perf). With a P per session a sleeping loop gets its P back at
// once when it wakes. Ps beyond that cost: every Gosched of a spinning loop
// then wakes an idle runtime thread that competes with the clients for the
// CPUs (one extra P per session on top of the CPUs took 1-session Put+Get
// from 20.3-21.9 to 16.6-17.0 GB/s), so there are never more Ps than
// sessions beyond the CPUs.
//
// Measured on 2 CPUs, 4 sessions of 2 MiB Put+Get (scripts/redisbench, 8
// interleaved runs each, docs/benchmarks.md): median 17.3 → 18.8 GB/s; the
// same runs' 4-session single-key lookups lose about 15% (the machine was
// noisy; see docs/benchmarks.md).
//
// An operator's GOMAXPROCS environment setting is left alone. The base is
// the runtime's choice at start (CPUs, or the cgroup's CPU limit); setting
// GOMAXPROCS ends the runtime's own later updates from the cgroup, so a
// limit changed while the daemon runs takes effect at its next start.
type procSizer struct {
	mu    sync.Mutex
	base  int // GOMAXPROCS at start
	max   int
	cur   int
	fixed bool
}

// procsPerCPU bounds the Ps: beyond a few sleeping loops per CPU the
// runtime's retakes are no longer the cost, and the garbage collector sizes
// its workers by GOMAXPROCS.
const procsPerCPU = 4

func (p *procSizer) init() {
	p.base = runtime.GOMAXPROCS(0)
	p.cur = p.base
	p.max = procsPerCPU * p.base
	_, p.fixed = os.LookupEnv("GOMAXPROCS")
}

// resize sets GOMAXPROCS for n live sessions. It stops the world briefly,
// which is fine at session open and close.
func (p *procSizer) resize(n int) {
	if p.fixed || p.base == 0 {
		return
	}
	want := min(max(p.base, n), p.max)
	p.mu.Lock()
	defer p.mu.Unlock()
	if want != p.cur {
		runtime.GOMAXPROCS(want)
		p.cur = want
	}
}
