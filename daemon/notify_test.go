package daemon

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeNotifySocket is systemd's side of sd_notify(3): a unixgram socket
// whose path is put in $NOTIFY_SOCKET.
type fakeNotifySocket struct {
	t    *testing.T
	conn *net.UnixConn
}

func newFakeNotifySocket(t *testing.T) *fakeNotifySocket {
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return &fakeNotifySocket{t: t, conn: conn}
}

// next returns the next message, failing the test after timeout.
func (f *fakeNotifySocket) next(timeout time.Duration) string {
	f.t.Helper()
	buf := make([]byte, 4096)
	f.conn.SetReadDeadline(time.Now().Add(timeout))
	n, err := f.conn.Read(buf)
	if err != nil {
		f.t.Fatalf("no sd_notify message within %v: %v", timeout, err)
	}
	return string(buf[:n])
}

// await reads messages until one contains want, returning it.
func (f *fakeNotifySocket) await(want string, timeout time.Duration) string {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := f.next(time.Until(deadline))
		if hasAssignment(msg, want) {
			return msg
		}
		f.t.Logf("notify (skipped): %q", msg)
	}
}

// hasAssignment reports whether a line of msg starts with want.
func hasAssignment(msg, want string) bool {
	for _, l := range strings.Split(msg, "\n") {
		if strings.HasPrefix(l, want) {
			return true
		}
	}
	return false
}

// TestNotifyProtocol runs the daemon in-process against a fake
// NOTIFY_SOCKET with a watchdog: READY=1 with a STATUS, WATCHDOG=1 pings,
// periodic STATUS, RELOADING=1/READY=1 around a reload, STOPPING=1 at stop.
func TestNotifyProtocol(t *testing.T) {
	sock := newFakeNotifySocket(t)
	t.Setenv("WATCHDOG_USEC", strconv.Itoa(int((200 * time.Millisecond).Microseconds())))
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	old := statusInterval
	statusInterval = 30 * time.Millisecond
	t.Cleanup(func() { statusInterval = old })

	cfg := testConfig(t)
	r := startDaemon(t, cfg, nil)

	ready := sock.next(5 * time.Second)
	if !hasAssignment(ready, "READY=1") || !hasAssignment(ready, "STATUS=serving "+cfg.Socket) {
		t.Fatalf("first message = %q, want READY=1 with the serving STATUS", ready)
	}
	if !strings.Contains(ready, "0 sessions") || !strings.Contains(ready, "host 0 B/8.0 MiB") || !strings.Contains(ready, "nvme off") {
		t.Errorf("ready status = %q, want sessions and tiers", ready)
	}
	// Pings at half of WATCHDOG_USEC: two within 100ms of each other,
	// interleaved with status updates.
	t0 := time.Now()
	sock.await("WATCHDOG=1", 10*time.Second)
	sock.await("WATCHDOG=1", 10*time.Second)
	if dt := time.Since(t0); dt > time.Second {
		t.Errorf("two watchdog pings took %v; want about 100ms apart", dt)
	}
	sock.await("STATUS=", 10*time.Second)

	next := cfg
	next.Host.HighWatermark = 0.9
	if err := r.d.Reload(next); err != nil {
		t.Fatal(err)
	}
	if msg := sock.await("RELOADING=1", 10*time.Second); !hasAssignment(msg, "MONOTONIC_USEC=") {
		t.Errorf("reloading message = %q, want MONOTONIC_USEC", msg)
	}
	sock.await("READY=1", 10*time.Second)

	r.cancel()
	msg := sock.await("STOPPING=1", 5*time.Second)
	if !hasAssignment(msg, "STATUS=stopping: ") {
		t.Errorf("stopping message = %q, want a stopping STATUS", msg)
	}
	r.stop(t)
}

// TestNotifyWithoutSystemd: no NOTIFY_SOCKET, no watchdog: the daemon runs
// and stops as before, and a watchdog meant for another pid is ignored.
func TestNotifyWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "1000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()+1))
	r := startDaemon(t, testConfig(t), nil)
	time.Sleep(20 * time.Millisecond)
	r.stop(t)
}
