//go:build !linux

package daemon

import "time"

// procWatch: without pidfds no exit is seen; quarantined reservations wait
// for their deadline.
type procWatch struct{}

func watchProc(uint32) (procWatch, bool) { return procWatch{}, false }

func (procWatch) close() {}

func pollExited(ws []procWatch, timeout time.Duration) []bool {
	time.Sleep(timeout)
	return make([]bool, len(ws))
}
