package client

import (
	"runtime"
	"time"
)

// DispatchThenKill stands for an interleaving of the session's own
// goroutines: another poller (a concurrent caller or the reaper) dispatches
// the completion a caller waits for, and right after that the connection
// dies (the reader saw the daemon go, or Session.Close ran); the reaper
// exits and drops the connection's own reference. It returns once the
// reaper is gone.
//
// The caller polls the same ring: if it took its completion first (this
// goroutine preempted on a loaded machine), nothing is left to dispatch, so
// it waits for no call to be pending rather than for a poll of its own to
// find something (which never came: the test hung).
func DispatchThenKill(s *Session) {
	s.mu.Lock()
	cn := s.cur
	s.mu.Unlock()
	for !cn.poll() {
		cn.pmu.Lock()
		idle := len(cn.pending) == 0
		cn.pmu.Unlock()
		if idle {
			break
		}
		runtime.Gosched()
	}
	cn.kill(ErrDisconnected)
	<-cn.reaperDone
}

// SetReaperExitHook makes every reaper run f as it exits, before it drops
// its connection's reference; the returned func restores the default.
// Set it before the connections it is meant for start.
func SetReaperExitHook(f func()) (restore func()) {
	testReaperExit = f
	return func() { testReaperExit = nil }
}

// SetCloseAnswerWait changes how long Close waits for the answers of device
// puts' commits; the returned func restores it.
func SetCloseAnswerWait(d time.Duration) (restore func()) {
	old := closeAnswerWait
	closeAnswerWait = d
	return func() { closeAnswerWait = old }
}
