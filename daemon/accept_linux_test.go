//go:build linux

package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
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

// TestFDShortageStartsAfresh: a peer is refused on the spare fd only once
// accept has failed for acceptShortage. A shortage used to begin at the
// first failure after a successful accept, so a shortage long over (its end
// unseen: the loop was waiting on the spare fd's accept, and the next accept
// failed again) counted from its old start, and the next peer was refused at
// once instead of after acceptShortage.
func TestFDShortageStartsAfresh(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	type step struct {
		at     time.Duration // a failed accept at this time; < 0: a successful accept
		lasted bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"backs off to a second and lasts", []step{{0, false}, {ms(5), false}, {ms(15), false}, {ms(35), false}, {ms(500), false}, {ms(1000), true}, {ms(2000), true}}},
		{"a gap of one backoff is the same shortage", []step{{0, false}, {ms(1000), true}, {ms(2900), true}}},
		{"a quiet hour starts a new one", []step{{0, false}, {ms(1200), true}, {time.Hour, false}, {time.Hour + ms(600), false}, {time.Hour + ms(1000), true}}},
		{"an accept ends it", []step{{0, false}, {ms(1200), true}, {-1, false}, {ms(1300), false}, {ms(2300), true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Now()
			var s fdShortage
			for i, st := range tc.steps {
				if st.at < 0 {
					s.end()
					continue
				}
				if got := s.fail(t0.Add(st.at)); got != st.lasted {
					t.Errorf("step %d (failure at %v): lasted=%v, want %v", i, st.at, got, st.lasted)
				}
			}
		})
	}
}

// TestAnswerOnSpareServesWhenFDsAreBack: the peer accepted on the spare fd
// may come long after the shortage ended (that accept waits for the next
// peer). It is then served, not refused "out of file descriptors", and the
// spare is held again for the next shortage. (Its refusal while fds are
// still short is TestOutOfFDsRefusesClearly, cmd/kvtierd.)
func TestAnswerOnSpareServesWhenFDsAreBack(t *testing.T) {
	cfg := testConfig(t)
	r := startDaemon(t, cfg, nil)
	dialAdmin(t, cfg).Close() // serving

	// A listener of the test's own stands in for the daemon's, so that the
	// connection reaches answerOnSpare and nothing else.
	path := filepath.Join(t.TempDir(), "spare.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Every connection of the client (Dial's admin one, then the session's)
	// is answered as one accepted on the spare fd.
	var wg sync.WaitGroup
	var spares []*spareFD
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			spare := new(spareFD) // given up to accept c, as the accept loop does
			spares = append(spares, spare)
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.d.answerOnSpare(context.Background(), c, spare, unix.EMFILE)
			}()
		}
	}()
	cl, err := client.Dial(context.Background(), client.Options{Socket: path, Name: "after-shortage"})
	if err != nil {
		t.Fatalf("a peer accepted on the spare fd after the shortage ended: %v", err)
	}
	s, err := cl.Open(context.Background(), testNamespace(64*KiB))
	if err != nil {
		t.Fatal(err)
	}
	putBlocks(t, s, 1)
	got := make([]byte, s.BlockBytes())
	if err := s.Get(context.Background(), testHash(0), got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{1}, s.BlockBytes())) {
		t.Fatal("the session served on the spare fd read back other bytes")
	}
	cl.Close()
	ln.Close()
	<-accepting
	wg.Wait()
	if len(spares) != 2 {
		t.Errorf("%d connections answered, want 2 (admin, session)", len(spares))
	}
	for i, spare := range spares {
		if !spare.held() {
			t.Errorf("connection %d: the spare fd was not taken again after the shortage", i)
		}
		spare.close()
	}
}
