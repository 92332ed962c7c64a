package daemon

// Peers that make the daemon's state grow: namespaces, admin connections.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// TestStatusWithManyNamespaces: every namespace a hello names is registered
// for good (up to maxNamespaces), and the status reply listed them all in one
// SOCK_SEQPACKET message, which the socket's send buffer caps (about 208 KiB
// by default): a few hundred namespaces with long model ids and no operator
// could read the status any more (kvtierctl status, top).
func TestStatusWithManyNamespaces(t *testing.T) {
	cfg := testConfig(t)
	r := startDaemon(t, cfg, slog.New(slog.DiscardHandler))
	// What a hello naming a new namespace does (rawOpen's handshakes would
	// take seconds more and register the same).
	const n = 600
	for i := range n {
		if _, err := r.d.reg.Register(rawNS(fmt.Sprintf("%s-%d", strings.Repeat("m", 240), i), 4096)); err != nil {
			t.Fatal(err)
		}
	}
	// A namespace in use is listed whatever else is registered.
	p, code := rawOpen(t, cfg.Socket, rawNS("in-use", 4096))
	if p == nil {
		t.Fatalf("session refused: %d", code)
	}
	c := dialDaemon(t, cfg)
	var st *client.Stats
	// The session joins the daemon's table just after its Welcome.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if st, err = c.Stats(context.Background()); err != nil {
			t.Fatalf("status with %d namespaces registered: %v", n+1, err)
		}
		if st.Sessions == 1 || time.Now().After(deadline) {
			break
		}
	}
	if st.NamespacesTotal != n+1 || len(st.Namespaces) >= n+1 {
		t.Errorf("namespaces_total = %d, listed %d; want %d, fewer listed", st.NamespacesTotal, len(st.Namespaces), n+1)
	}
	if len(st.Namespaces) == 0 || st.Namespaces[0].Namespace.ModelID != "in-use" || st.Namespaces[0].Sessions != 1 {
		t.Errorf("the namespace with a session is not listed first: %+v", st.Namespaces[:min(1, len(st.Namespaces))])
	}
	for i := 2; i < len(st.Namespaces); i++ {
		if st.Namespaces[i].ID <= st.Namespaces[i-1].ID {
			t.Fatalf("namespaces without sessions not in id order: %d after %d", st.Namespaces[i].ID, st.Namespaces[i-1].ID)
		}
	}
}

// rawAdmin opens an admin connection and returns it with the daemon's
// answer: 0 for a Welcome, else the refusal's code.
func rawAdmin(t *testing.T, socket string) (*net.UnixConn, shm.ErrCode) {
	t.Helper()
	c := rawDial(t, socket)
	h := shm.Hello{Flags: shm.HelloFlagAdmin, Name: "raw-admin"}
	if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, h.Encode())); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, _, err := shm.RecvMsg(c, make([]byte, 4096), 0)
	if err != nil {
		t.Fatalf("admin hello: %v", err)
	}
	c.SetReadDeadline(time.Time{})
	typ, _, p, err := shm.DecodeMsg(raw)
	if err != nil {
		t.Fatal(err)
	}
	if typ == shm.MsgWelcome {
		return c, 0
	}
	e, err := shm.DecodeError(p)
	if typ != shm.MsgError || err != nil {
		t.Fatalf("admin hello answered with message type %d (%v)", typ, err)
	}
	return c, e.Code
}

// TestAdminConnectionsBounded: an admin connection (status, evict, flush)
// was counted against no limit and, once welcomed, could stay idle for as
// long as its peer liked, each holding a goroutine and a file descriptor of
// the daemon's: one local process could take every fd the daemon has, and
// every other client's next session was refused.
func TestAdminConnectionsBounded(t *testing.T) {
	cfg := testConfig(t) // max_admin 64
	startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), func(d *Daemon) { d.adminIdle = 2 * time.Second })
	const n = 200
	t0 := time.Now()
	var held []*net.UnixConn
	for range n {
		c, code := rawAdmin(t, cfg.Socket)
		if code != 0 {
			// Every place is held by an idle connection: the one idle
			// longest gives its place up (TestAdminHoarderCannotLockOut).
			t.Fatalf("admin connection refused with code %d while the others sat idle", code)
		}
		held = append(held, c)
	}
	t.Logf("%d admin hellos in %v", n, time.Since(t0))
	// At most session.max_admin of them are open: the others were closed
	// by the daemon (EOF), the oldest first.
	var open []*net.UnixConn
	// One deadline for all (well inside adminIdle): the open ones time out.
	until := time.Now().Add(200 * time.Millisecond)
	for i, c := range held {
		c.SetReadDeadline(until)
		_, _, err := shm.RecvMsg(c, make([]byte, 4096), 0)
		switch {
		case errors.Is(err, io.EOF):
			if i >= n-cfg.Session.MaxAdmin {
				t.Fatalf("admin connection %d of %d closed, want the %d newest open", i, n, cfg.Session.MaxAdmin)
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			open = append(open, c)
		default:
			t.Fatalf("admin connection %d: read %v", i, err)
		}
	}
	if len(open) != cfg.Session.MaxAdmin {
		t.Fatalf("%d idle admin connections held at once, want session.max_admin = %d", len(open), cfg.Session.MaxAdmin)
	}
	// Sessions are not admin connections: they still open.
	if p, code := rawOpen(t, cfg.Socket, rawNS("raw-after-admins", 4096)); p == nil {
		t.Fatalf("session refused (%d) while admin connections are at their limit", code)
	}
	// The idle ones are closed, and their places taken again.
	for i, c := range open {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := shm.RecvMsg(c, make([]byte, 4096), 0); !errors.Is(err, io.EOF) {
			t.Fatalf("idle admin connection %d: read %v, want EOF (closed by the daemon)", i, err)
		}
	}
	waitAdminWelcomed(t, cfg.Socket, "after the idle ones were closed")
	for _, c := range held {
		c.Close()
	}
}

// TestAdminHoarderCannotLockOut: a process that sent a request now and
// then (under adminIdle) on each of session.max_admin admin connections
// held every place for as long as it liked, and kvtierctl was refused busy.
// The connection waiting longest for its next request now gives its place
// to a newer one.
func TestAdminHoarderCannotLockOut(t *testing.T) {
	cfg := testConfig(t)
	cfg.Session.MaxAdmin = 4
	startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), func(d *Daemon) { d.adminIdle = 3 * time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var closed atomic.Int32
	for i := range cfg.Session.MaxAdmin {
		c, code := rawAdmin(t, cfg.Socket)
		if code != 0 {
			t.Fatalf("hoarder's admin connection %d refused: %d", i, code)
		}
		wg.Go(func() {
			defer c.Close()
			buf := make([]byte, 1<<16)
			for ctx.Err() == nil {
				// A status request every 300 ms, a tenth of the idle bound.
				if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, nil)); err != nil {
					closed.Add(1)
					return
				}
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, _, err := shm.RecvMsg(c, buf, 0); err != nil {
					closed.Add(1)
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(300 * time.Millisecond):
				}
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(time.Second) // the hoarder's loops are running
	for try := range 3 {
		c, code := rawAdmin(t, cfg.Socket)
		if code != 0 {
			c.Close()
			if code == shm.CodeBusy && try < 2 {
				// Every hoarder connection mid-request at once: rare.
				time.Sleep(50 * time.Millisecond)
				continue
			}
			t.Fatalf("admin connection refused with code %d while a process sending a status request every 300ms on all session.max_admin (%d) connections held them", code, cfg.Session.MaxAdmin)
		}
		defer c.Close()
		// The newcomer is served.
		if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, nil)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		raw, _, err := shm.RecvMsg(c, make([]byte, 1<<16), 0)
		if err != nil {
			t.Fatalf("status on the newcomer's connection: %v", err)
		}
		if typ, _, _, err := shm.DecodeMsg(raw); err != nil || typ != shm.MsgStatsReply {
			t.Fatalf("status on the newcomer's connection answered with type %d (%v)", typ, err)
		}
		break
	}
	// The place came from one of the hoarder's connections, which is closed.
	for deadline := time.Now().Add(5 * time.Second); closed.Load() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the hoarder's connections closed, want 1 (the place the newcomer took)", closed.Load())
		}
	}
}

// TestAdminToDisplace: the place given up is one of a connection waiting
// for a request, of the uid holding the most places, the one waiting
// longest; none while all are answering a request.
func TestAdminToDisplace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	tests := []struct {
		name  string
		conns []adminConn
		want  int // index in conns, -1 for none
	}{
		{"oldest idle", []adminConn{{uid: 7, since: at(5), seq: 1}, {uid: 7, since: at(2), seq: 2}, {uid: 7, since: at(9), seq: 3}}, 1},
		{"busy skipped", []adminConn{{uid: 7, since: at(1), seq: 1, busy: true}, {uid: 7, since: at(2), seq: 2}}, 1},
		{"all busy", []adminConn{{uid: 7, since: at(1), seq: 1, busy: true}, {uid: 0, since: at(2), seq: 2, busy: true}}, -1},
		{"uid holding most", []adminConn{{uid: 0, since: at(1), seq: 1}, {uid: 1000, since: at(8), seq: 2}, {uid: 1000, since: at(9), seq: 3}}, 1},
		{"uid holding most idle", []adminConn{{uid: 0, since: at(1), seq: 1}, {uid: 0, since: at(3), seq: 2}, {uid: 1000, since: at(8), seq: 3, busy: true}, {uid: 1000, since: at(8), seq: 4, busy: true}, {uid: 1000, since: at(9), seq: 5}}, 0},
		{"tie of uids: lowest", []adminConn{{uid: 1000, since: at(1), seq: 1}, {uid: 5, since: at(8), seq: 2}}, 1},
		{"tie of waits: older", []adminConn{{uid: 5, since: at(3), seq: 2}, {uid: 5, since: at(3), seq: 1}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := map[*adminConn]struct{}{}
			for i := range tt.conns {
				m[&tt.conns[i]] = struct{}{}
			}
			for range 20 { // map order must not matter
				got := adminToDisplace(m)
				switch {
				case tt.want < 0 && got != nil:
					t.Fatalf("displaced uid %d seq %d, want none", got.uid, got.seq)
				case tt.want >= 0 && got != &tt.conns[tt.want]:
					t.Fatalf("displaced %+v, want %+v", got, tt.conns[tt.want])
				}
			}
		})
	}
}

// TestPeerCannotFloodTheLog: every refused handshake logged a warning, so a
// local process connecting in a loop wrote the daemon's log as fast as it
// could connect; journald then drops the whole service's lines past its rate
// limit (10,000 per 30 s by default), the ones that matter with them.
func TestPeerCannotFloodTheLog(t *testing.T) {
	cfg := testConfig(t)
	var logs syncBuffer
	startDaemon(t, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	bad := func() {
		c := rawDial(t, cfg.Socket)
		defer c.Close()
		// A stats request where the hello belongs.
		if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, nil)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := shm.RecvMsg(c, make([]byte, 4096), 0); err != nil {
			t.Fatalf("refusal: %v", err)
		}
	}
	const n = 2000
	t0 := time.Now()
	for range n {
		bad()
	}
	took := time.Since(t0)
	count := func(msg string) int { return strings.Count(logs.String(), `msg="`+msg+`"`) }
	got := count("handshake failed")
	t.Logf("%d bad handshakes in %v: %d lines logged", n, took, got)
	if got == 0 || got > 40+int(took.Seconds()) {
		t.Fatalf("%d bad handshakes in %v logged %d warnings, want a few (rate-limited)", n, took.Round(time.Millisecond), got)
	}
	// Other lines are not held back by that one's flood.
	if p, code := rawOpen(t, cfg.Socket, rawNS("raw-after-flood", 4096)); p == nil {
		t.Fatalf("session refused: %d", code)
	}
	for deadline := time.Now().Add(5 * time.Second); count("session opened") == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(`no "session opened" line after the flood of another message`)
		}
	}
	// Once the rate allows it again, the line says how many it stood for.
	time.Sleep(1100 * time.Millisecond)
	bad()
	if !strings.Contains(logs.String(), "suppressed=") {
		t.Fatal("the next line after the flood does not say how many were suppressed")
	}
}

// TestAdminPeerThatNeverReadsLetGo: a reply on an admin connection had no
// write deadline (outside a stop), so a peer that sent requests and never
// read the replies blocked the daemon's write for good, holding one of
// session.max_admin's places: a few such peers locked kvtierctl out. A reply
// not read within adminReplyTimeout closes the connection, with a line.
func TestAdminPeerThatNeverReadsLetGo(t *testing.T) {
	cfg := testConfig(t)
	cfg.Session.MaxAdmin = 1
	var logs syncBuffer
	const bound = 300 * time.Millisecond
	startDaemonWith(t, cfg, slog.New(slog.NewTextHandler(&logs, nil)), func(d *Daemon) { d.adminReply = bound })
	c, code := rawAdmin(t, cfg.Socket)
	if code != 0 {
		t.Fatalf("admin connection refused: %d", code)
	}
	defer c.Close()
	// Status requests, never reading a reply, until our own send blocks (the
	// daemon's write blocked and its receive queue filled) or fails (the
	// daemon closed the connection).
	sent := 0
	for ; sent < 100_000; sent++ {
		c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, nil)); err != nil {
			break
		}
	}
	t.Logf("%d status requests sent without reading a reply", sent)
	const wait = 10 * time.Second
	for deadline := time.Now().Add(wait); ; time.Sleep(50 * time.Millisecond) {
		c2, code := rawAdmin(t, cfg.Socket)
		c2.Close()
		if code == 0 {
			break
		}
		if code != shm.CodeBusy {
			t.Fatalf("admin connection refused with code %d", code)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the only admin place (session.max_admin 1) is still held %v after its peer stopped reading its replies (%d requests sent): kvtierctl refused busy", wait, sent)
		}
	}
	// The daemon closed it: EOF after the replies it sent, or a reset (it
	// closed with our requests unread).
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1<<16)
	for {
		_, _, err := shm.RecvMsg(c, buf, 0)
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			break
		}
		if err != nil {
			t.Fatalf("reading the unread replies: %v, want the connection closed by the daemon", err)
		}
	}
	if !strings.Contains(logs.String(), "reply not read within "+bound.String()) {
		t.Errorf("no line says why the admin connection was closed; log:\n%s", logs.String())
	}
}

// TestPreHelloConnectionsBounded: a connection accepted and silent holds an
// fd, a goroutine and a hello buffer until handshakeTimeout. With no bound
// on how many, a process connecting in a loop held tens of thousands at
// once and could take the daemon's fds. Past maxPreHello the daemon refuses
// busy at once; once the silent ones go, connections are served again.
func TestPreHelloConnectionsBounded(t *testing.T) {
	const bound = 8
	cfg := testConfig(t)
	r := startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), func(d *Daemon) { d.maxPreHello = bound })
	var silent []*net.UnixConn
	for range bound {
		silent = append(silent, rawDial(t, cfg.Socket))
	}
	for deadline := time.Now().Add(5 * time.Second); r.d.preHello.Load() < bound; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d silent connections in their handshake after 5s", r.d.preHello.Load(), bound)
		}
	}
	c, code := rawAdmin(t, cfg.Socket)
	c.Close()
	if code != shm.CodeBusy {
		t.Fatalf("a connection while %d sat silent in their handshake (bound %d): answered with code %d, want busy (%d)", bound, bound, code, shm.CodeBusy)
	}
	for _, s := range silent {
		s.Close()
	}
	waitAdminWelcomed(t, cfg.Socket, "5s after the silent connections hung up")
	if n := r.d.preHello.Load(); n != 0 {
		t.Fatalf("%d connections counted in their handshake after all hung up or were welcomed", n)
	}
}

// waitAdminWelcomed retries an admin connection until it is welcomed,
// failing the test (saying when) if it is still refused after 5 s.
func waitAdminWelcomed(t *testing.T, socket, when string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, code := rawAdmin(t, socket)
		c.Close()
		if code == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin connection refused (%d) %s", code, when)
		}
	}
}
