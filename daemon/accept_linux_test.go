//go:build linux

package daemon

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
)

// TestAcceptOutOfFdsKeepsServing: running out of file descriptors (a burst
// of connections, admin peers that stay, sessions) makes accept fail with
// EMFILE for as long as it lasts. The daemon used to take any accept error
// as fatal and shut down; it must wait for fds to free and serve on.
func TestAcceptOutOfFdsKeepsServing(t *testing.T) {
	cfg := testConfig(t)
	var logs syncBuffer
	r := startDaemon(t, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	dialAdmin(t, cfg).Close() // serving

	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	restore := func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &old) }
	defer restore()
	// Leave exactly one fd: the client's socket takes it, the daemon's
	// accept of that connection finds none.
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	low := old
	low.Cur = uint64(fd) + 1
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: cfg.Socket, Net: "unixpacket"})
	if err != nil {
		restore()
		t.Fatalf("dial with one fd left: %v", err)
	}
	defer c.Close()
	// Wait until the daemon has met EMFILE (its log says so) or stopped.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "too many open files"); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			restore()
			t.Fatal("the daemon's accept never failed with EMFILE")
		}
	}
	restore()

	// Fds are back: the queued connection is served, and so are new ones.
	h := shm.Hello{Flags: shm.HelloFlagAdmin, Name: "after-emfile"}
	if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, h.Encode())); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, _, err := shm.RecvMsg(c, make([]byte, 4096), 0)
	if err != nil {
		t.Fatalf("connection queued during EMFILE not served: %v (daemon stopped: %v)", err, stoppedEarly(r))
	}
	if ty, _, _, err := shm.DecodeMsg(raw); err != nil || ty != shm.MsgWelcome {
		t.Fatalf("welcome: type %d err %v", ty, err)
	}
	dialAdmin(t, cfg).Close()
	if stoppedEarly(r) {
		t.Fatal("Run returned after EMFILE")
	}
}

// stoppedEarly reports whether Run has returned on its own.
func stoppedEarly(r *running) bool {
	select {
	case <-r.done:
		r.done = nil
		return true
	default:
		return false
	}
}

// TestAcceptBrokenStopsPromptly: when the listener breaks for good, Run
// stops with an error. It used to wait, without end, for admin peers (cut
// only by Run's context, which nobody cancelled) while the watchdog pings
// went on: systemd saw a healthy daemon that no longer accepted anyone.
func TestAcceptBrokenStopsPromptly(t *testing.T) {
	cfg := testConfig(t)
	r := startDaemon(t, cfg, nil)
	admin := dialAdmin(t, cfg) // an idle `kvtierctl top`, say
	defer admin.Close()
	// An accept error that is no shortage (an LSM denial, a listener
	// gone bad); closing the listener under Run stands in for one.
	r.d.ln.Close()
	select {
	case err := <-r.done:
		r.done = nil
		if err == nil {
			t.Fatal("Run returned nil after its listener broke")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of its listener breaking: it waits for an idle admin peer")
	}
}
