package shm

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The doorbell futexes live in memory shared between processes, so the
// shared (non-PRIVATE) futex operations are required.
const (
	futexWait = 0
	futexWake = 1
)

// futexWaitOn sleeps while *addr == val, at most d. Spurious returns are
// fine: every caller re-checks its condition.
func futexWaitOn(addr *atomic.Uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWakeAll(addr *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, 1<<30, 0, 0, 0)
}

// osYield gives the CPU to another runnable thread queued on it, if any
// (raw: it returns at once when there is none, and the P stays ours).
func osYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
