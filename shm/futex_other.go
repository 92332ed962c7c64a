//go:build !linux

package shm

import (
	"sync/atomic"
	"time"
)

// Portable doorbell fallback for platforms without futexes: the waiter polls
// the sequence word with a growing sleep, so a wake-up costs at most one poll
// interval and the bound d is kept. Waking is a no-op: the producer already
// bumped the sequence word, which is what the poll watches.
const (
	pollMin = 20 * time.Microsecond
	pollMax = time.Millisecond
)

// futexWaitOn sleeps while *addr == val, at most d. Spurious returns are
// fine: every caller re-checks its condition.
func futexWaitOn(addr *atomic.Uint32, val uint32, d time.Duration) {
	if d <= 0 {
		return
	}
	deadline := time.Now().Add(d)
	step := pollMin
	for addr.Load() == val {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		time.Sleep(min(step, left))
		step = min(2*step, pollMax)
	}
}

func futexWakeAll(*atomic.Uint32) {}

// osYield: Gosched already yielded what this platform lets us yield.
func osYield() {}
