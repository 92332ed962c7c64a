package daemon

import (
	"os"
	"runtime"
	"sync"
)

// procSizer gives the Go runtime one P per session on top of the CPUs.
//
// A ring loop with nothing to do sleeps in a futex system call, and a
// goroutine blocked in a system call keeps its P until sysmon takes it back
// (20 µs to 10 ms later). With GOMAXPROCS equal to the CPUs and more
// sessions than CPUs, the other ring loops then wait for a P, and each wake-up
// costs extra thread hand-offs (retake, handoffp, exitsyscall without a P:
// 12% of the daemon's CPU at 4 sessions on 2 CPUs). With a spare P per
// session a sleeping loop gets its P back at once when it wakes. The CPUs
// themselves are not oversubscribed by this: sleeping loops use none, and
// spinning loops are capped separately (maxSpinners, maxHot).
//
// Measured on 2 CPUs, 4 sessions of 2 MiB Put+Get (scripts/redisbench,
// interleaved runs, docs/benchmarks.md): 20.4 → 23.9 GB/s median.
//
// An operator's GOMAXPROCS environment setting is left alone.
type procSizer struct {
	mu    sync.Mutex
	base  int // GOMAXPROCS at start
	max   int
	cur   int
	fixed bool
}

// procsPerCPU bounds the extra Ps: beyond a few sleeping loops per CPU the
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
	want := min(p.base+n, p.max)
	p.mu.Lock()
	defer p.mu.Unlock()
	if want != p.cur {
		runtime.GOMAXPROCS(want)
		p.cur = want
	}
}
