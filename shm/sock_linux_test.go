package shm

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func seqpacketPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// pipes returns n fresh fds (pipe ends), closed at cleanup.
func pipeFDs(t *testing.T, n int) []int {
	t.Helper()
	var fds []int
	for len(fds) < n {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		fds = append(fds, p[0], p[1])
	}
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	return fds[:n]
}

func TestSendRecvMsg(t *testing.T) {
	a, b := seqpacketPair(t)
	msg := EncodeMsg(MsgStatsReq, ProtocolVersion, []byte("hi"))
	if err := SendMsg(a, msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	got, fds, err := RecvMsg(b, buf, 0)
	if err != nil || len(fds) != 0 || !bytes.Equal(got, msg) {
		t.Fatalf("RecvMsg = %q, %v, %v", got, fds, err)
	}
}

func TestSendRecvFDs(t *testing.T) {
	a, b := seqpacketPair(t)
	reg, err := CreateRegion("kvtier-sock-test", 4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])

	w := Welcome{SessionID: 1, RingSize: 4096}
	if err := SendMsg(a, EncodeMsg(MsgWelcome, ProtocolVersion, w.Encode()), reg.Fd(), p[1]); err != nil {
		t.Fatal(err)
	}
	got, fds, err := RecvMsg(b, make([]byte, 256), WelcomeFDs)
	if err != nil {
		t.Fatal(err)
	}
	if len(fds) != 2 {
		t.Fatalf("got %d fds", len(fds))
	}
	if _, _, payload, err := DecodeMsg(got); err != nil {
		t.Fatal(err)
	} else if m, err := DecodeWelcome(payload); err != nil || m != w {
		t.Fatalf("welcome %+v %v", m, err)
	}
	// The region fd maps the same memory.
	m, err := MapRegion(fds[0], 4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	reg.Bytes()[10] = 99
	if m.Bytes()[10] != 99 {
		t.Fatal("passed region does not share memory")
	}
	// The pipe fd writes into our pipe.
	if _, err := unix.Write(fds[1], []byte("x")); err != nil {
		t.Fatal(err)
	}
	unix.Close(fds[1])
	rb := make([]byte, 1)
	if n, err := unix.Read(p[0], rb); err != nil || n != 1 || rb[0] != 'x' {
		t.Fatalf("read %d %q %v", n, rb, err)
	}
}

func TestRecvMsgTooManyFDs(t *testing.T) {
	for _, tc := range []struct {
		send, max int
	}{
		{1, 0},
		{3, 2},
		{WelcomeFDs + 1, WelcomeFDs},
		{40, 2}, // more than the control buffer holds: MSG_CTRUNC
		{200, 0},
	} {
		a, b := seqpacketPair(t)
		fds := pipeFDs(t, tc.send)
		before := openFDs(t)
		if err := SendMsg(a, []byte("hello"), fds...); err != nil {
			t.Fatal(err)
		}
		got, rfds, err := RecvMsg(b, make([]byte, 64), tc.max)
		if !errors.Is(err, ErrTooManyFDs) || got != nil || rfds != nil {
			t.Fatalf("send %d max %d: RecvMsg = %q, %v, %v; want ErrTooManyFDs", tc.send, tc.max, got, rfds, err)
		}
		if after := openFDs(t); after != before {
			t.Fatalf("send %d max %d: %d fds open before, %d after: received fds leaked", tc.send, tc.max, before, after)
		}
	}
}

func TestRecvMsgTruncated(t *testing.T) {
	a, b := seqpacketPair(t)
	fds := pipeFDs(t, 1)
	before := openFDs(t)
	if err := SendMsg(a, bytes.Repeat([]byte{'a'}, 100), fds...); err != nil {
		t.Fatal(err)
	}
	_, rfds, err := RecvMsg(b, make([]byte, 10), 1)
	if !errors.Is(err, ErrMalformed) || rfds != nil {
		t.Fatalf("RecvMsg of oversized message = %v, %v", rfds, err)
	}
	if after := openFDs(t); after != before {
		t.Fatalf("%d fds before, %d after", before, after)
	}
	// The socket stays usable: the next datagram is intact.
	if err := SendMsg(a, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	got, _, err := RecvMsg(b, make([]byte, 10), 0)
	if err != nil || string(got) != "ok" {
		t.Fatalf("next message %q, %v", got, err)
	}
}

func TestRecvMsgEOF(t *testing.T) {
	a, b := seqpacketPair(t)
	a.Close()
	if _, _, err := RecvMsg(b, make([]byte, 10), 0); !errors.Is(err, io.EOF) {
		t.Fatalf("RecvMsg after peer close = %v, want EOF", err)
	}
}
