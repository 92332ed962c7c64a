package client

import "runtime"

// DispatchThenKill stands for an interleaving of the session's own
// goroutines: another poller (a concurrent caller or the reaper) dispatches
// the completion a caller waits for, and right after that the connection
// dies (the reader saw the daemon go, or Session.Close ran); the reaper
// exits and drops the connection's own reference. It returns once the
// reaper is gone.
func DispatchThenKill(s *Session) {
	s.mu.Lock()
	cn := s.cur
	s.mu.Unlock()
	for !cn.poll() {
		runtime.Gosched()
	}
	cn.kill(ErrDisconnected)
	<-cn.reaperDone
}
