package daemon

import (
	"errors"

	"golang.org/x/sys/unix"
)

// processExited reports whether process pid has exited: reaped, or a
// zombie (its pidfd polls readable). A pid already reused by another
// process reads as alive.
func processExited(pid uint32) bool {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if err != nil {
		return errors.Is(err, unix.ESRCH)
	}
	defer unix.Close(fd)
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	return err == nil && n > 0 && pfd[0].Revents&unix.POLLIN != 0
}
