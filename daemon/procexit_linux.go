package daemon

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// procWatch follows one process until it has exited (a pidfd). The kernel
// makes a pidfd readable in exit_notify, after the process's files are
// closed: for a CUDA client, after its driver files are, and with them its
// contexts and whatever copies they had queued.
type procWatch struct{ fd int }

// watchProc opens a watch on pid; exited is true when pid has exited
// already (no watch is opened then). A pid that cannot be watched for any
// other reason reads as alive, and the caller's deadline applies.
func watchProc(pid uint32) (w procWatch, exited bool) {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if err != nil {
		return procWatch{fd: -1}, errors.Is(err, unix.ESRCH)
	}
	w = procWatch{fd: fd}
	if pollExited([]procWatch{w}, 0)[0] {
		w.close()
		return procWatch{fd: -1}, true
	}
	return w, false
}

func (w procWatch) close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
	}
}

// pollExited waits up to timeout for one of ws to exit and reports which
// have. A watch that could not be opened never reports.
func pollExited(ws []procWatch, timeout time.Duration) []bool {
	out := make([]bool, len(ws))
	pfd := make([]unix.PollFd, len(ws))
	for i, w := range ws {
		pfd[i] = unix.PollFd{Fd: int32(w.fd), Events: unix.POLLIN} // a negative fd is ignored
	}
	n, err := unix.Poll(pfd, int(timeout.Milliseconds()))
	if err != nil && !errors.Is(err, unix.EINTR) {
		time.Sleep(timeout) // no busy loop on an unexpected poll error
	}
	if err != nil || n == 0 {
		return out
	}
	for i := range pfd {
		out[i] = pfd[i].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) != 0
	}
	return out
}
