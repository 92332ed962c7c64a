package shm

import (
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// SendMsg writes one control message with optional fds attached.
func SendMsg(c *net.UnixConn, msg []byte, fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		return err
	}
	if n != len(msg) || oobn != len(oob) {
		return fmt.Errorf("short control write: %d/%d bytes, %d/%d oob", n, len(msg), oobn, len(oob))
	}
	return nil
}

// ErrTooManyFDs means a peer attached more fds than the message allows; they
// were closed.
var ErrTooManyFDs = errors.New("unexpected file descriptors")

// RecvMsg reads one control message into buf and returns it with any fds
// that came along (at most maxFDs; more, or a truncated datagram, is an
// error and every received fd is closed). The caller owns returned fds.
func RecvMsg(c *net.UnixConn, buf []byte, maxFDs int) ([]byte, []int, error) {
	oob := make([]byte, unix.CmsgSpace(4*max(maxFDs, 1)+4*8))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		scms, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return nil, nil, fmt.Errorf("%w: control data: %v", ErrMalformed, perr)
		}
		for _, s := range scms {
			got, rerr := unix.ParseUnixRights(&s)
			if rerr == nil {
				fds = append(fds, got...)
			}
		}
	}
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if flags&unix.MSG_CTRUNC != 0 && maxFDs > 0 && len(fds) <= maxFDs {
		// Fewer fds than the buffer holds, and fds were expected: the
		// kernel could not install them, for want of fd numbers here.
		closeAll()
		var lim unix.Rlimit
		_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
		return nil, nil, fmt.Errorf("%w: the fds sent with a message were dropped: this process is out of file descriptors (its limit is %d)", unix.EMFILE, lim.Cur)
	}
	if flags&unix.MSG_CTRUNC != 0 {
		// The kernel closed the fds that did not fit; len(fds) is only
		// those that did.
		closeAll()
		return nil, nil, fmt.Errorf("%w: control data truncated (more than %d fds, at most %d allowed)", ErrTooManyFDs, len(fds), maxFDs)
	}
	if len(fds) > maxFDs {
		closeAll()
		return nil, nil, fmt.Errorf("%w: got %d fds, at most %d allowed", ErrTooManyFDs, len(fds), maxFDs)
	}
	if flags&unix.MSG_TRUNC != 0 {
		closeAll()
		return nil, nil, fmt.Errorf("%w: message larger than %d bytes", ErrMalformed, len(buf))
	}
	if n == 0 {
		closeAll()
		return nil, nil, io.EOF
	}
	return buf[:n], fds, nil
}
