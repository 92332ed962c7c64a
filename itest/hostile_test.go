package itest

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
	"github.com/kvtier/kvtier/shm"
)

// Ring region header offsets (shm/ring.go layout comment). A hostile peer
// knows them too.
const (
	offSQTail  = 64
	offSQSleep = 192
	offSQSeq   = 196
	offCQHead  = 320
	offCQSleep = 384
	offCQSeq   = 388
)

func rawDial(t testing.TB, socket string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func helloMsg(ns shm.Namespace, flags uint32) []byte {
	h := shm.Hello{PID: uint32(os.Getpid()), Flags: flags, Namespace: ns, Name: "raw-peer"}
	return shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, h.Encode())
}

func send(t testing.TB, c *net.UnixConn, b []byte, fds ...int) {
	t.Helper()
	if err := shm.SendMsg(c, b, fds...); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// expectRefused reads the daemon's MsgError, checks its code and that the
// daemon then hangs up.
func expectRefused(t testing.TB, c *net.UnixConn, want shm.ErrCode) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, fds, err := shm.RecvMsg(c, make([]byte, shm.MaxControlMsg), 4)
	if err != nil {
		t.Fatalf("want a refusal (code %d), got %v", want, err)
	}
	if len(fds) != 0 {
		t.Fatalf("refusal carried %d fds", len(fds))
	}
	typ, _, p, err := shm.DecodeMsg(raw)
	if err != nil || typ != shm.MsgError {
		t.Fatalf("want MsgError, got type %d (%v)", typ, err)
	}
	e, err := shm.DecodeError(p)
	if err != nil {
		t.Fatal(err)
	}
	if e.Code != want {
		t.Fatalf("refused with code %d (%q), want %d", e.Code, e.Message, want)
	}
	t.Logf("refused: code %d: %s", e.Code, e.Message)
	// Hang up our half, as a client does after reading the refusal; the
	// daemon, which drains until then, closes at once.
	c.CloseWrite()
	expectClosed(t, c, 2*time.Second)
}

// expectClosed waits for the daemon to hang up on c.
func expectClosed(t testing.TB, c *net.UnixConn, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		_, fds, err := shm.RecvMsg(c, buf, 4)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err == nil {
			continue // e.g. a refusal before the hang-up
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("daemon did not close the connection within %v", d)
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("want EOF, got %v", err)
		}
		return
	}
}

// rawSession is a namespace session driven by hand: raw socket, raw ring.
type rawSession struct {
	t    testing.TB
	conn *net.UnixConn
	w    shm.Welcome
	reg  *shm.Region
	ring *shm.Ring
	mem  []byte
}

func openRaw(t testing.TB, socket string, ns shm.Namespace) *rawSession {
	t.Helper()
	c := rawDial(t, socket)
	send(t, c, helloMsg(ns, 0))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, fds, err := shm.RecvMsg(c, make([]byte, 64<<10), shm.WelcomeFDs)
	if err != nil {
		t.Fatalf("welcome: %v", err)
	}
	c.SetReadDeadline(time.Time{})
	typ, _, p, err := shm.DecodeMsg(raw)
	if err != nil || typ != shm.MsgWelcome || len(fds) != shm.WelcomeFDs {
		t.Fatalf("welcome: type %d fds %d err %v", typ, len(fds), err)
	}
	w, err := shm.DecodeWelcome(p)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fds[0]) // the arena: not needed here
	reg, err := shm.MapRegion(fds[1], int64(w.RingSize), false)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := shm.NewRing(reg.Bytes(), w.Ring, false)
	if err != nil {
		t.Fatal(err)
	}
	r := &rawSession{t: t, conn: c, w: w, reg: reg, ring: ring, mem: reg.Bytes()}
	t.Cleanup(r.close)
	return r
}

func (r *rawSession) close() {
	r.conn.Close()
	if r.reg != nil {
		r.reg.Close()
		r.reg = nil
	}
}

// store writes a header word the way a (hostile) peer can.
func (r *rawSession) store(off int, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.mem[off])), v)
}

// push submits entries and rings the doorbell.
func (r *rawSession) push(es ...shm.SQE) {
	r.t.Helper()
	if n := r.ring.ClientPush(es); n != len(es) {
		r.t.Fatalf("pushed %d of %d entries", n, len(es))
	}
	r.ring.ClientWake()
}

// pop waits for n completions.
func (r *rawSession) pop(n int) []shm.CQE {
	r.t.Helper()
	out := make([]shm.CQE, n)
	got := 0
	deadline := time.Now().Add(5 * time.Second)
	for got < n {
		got += r.ring.ClientPop(out[got:])
		if got < n {
			if time.Now().After(deadline) {
				r.t.Fatalf("%d of %d completions after 5s", got, n)
			}
			r.ring.ClientWait(0, 10*time.Millisecond, nil)
		}
	}
	return out
}

func (r *rawSession) do(es ...shm.SQE) []shm.CQE {
	r.t.Helper()
	for i := range es {
		if es[i].UserData == 0 {
			es[i].UserData = uint64(i + 1)
		}
	}
	r.push(es...)
	out := r.pop(len(es))
	for i := range out {
		if out[i].UserData != es[i].UserData {
			r.t.Fatalf("completion %d has user_data %d, want %d", i, out[i].UserData, es[i].UserData)
		}
	}
	return out
}

// fdCount counts a process's open fds.
func fdCount(t testing.TB, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestHostilePeers runs one daemon process, keeps a good session open, and
// throws malformed handshakes, protocol violations and ring corruption at
// it. Each must close only the offending connection; the good session keeps
// working after every case, and the daemon still stops cleanly at the end.
func TestHostilePeers(t *testing.T) {
	t.Parallel()
	dir := tmpDir(t)
	d := daemonProc(t, dir, nil)
	sock := socketOf(dir)
	const bs = 64 << 10
	ns := testNS("itest", bs)
	c := dial(t, sock)
	good := open(t, c, ns)
	roundTrip(t, good, 100)
	base := stats(t, c)
	baseFDs := fdCount(t, d.pid())

	// Peers that connect and never say Hello: dropped at the handshake
	// timeout while every case below runs.
	var silent []*net.UnixConn
	for i := 0; i < 3; i++ {
		silent = append(silent, rawDial(t, sock))
	}
	silentSince := time.Now()

	valid := helloMsg(ns, 0)
	hello := func(mod func(*shm.Hello)) []byte {
		h := shm.Hello{PID: 1, Namespace: ns, Name: "raw-peer"}
		mod(&h)
		return shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, h.Encode())
	}
	refused := func(b []byte, code shm.ErrCode) func(t *testing.T) {
		return func(t *testing.T) {
			cn := rawDial(t, sock)
			send(t, cn, b)
			expectRefused(t, cn, code)
		}
	}
	// violation opens a session, lets it break the ring protocol, and
	// expects the daemon to close it.
	violation := func(do func(r *rawSession)) func(t *testing.T) {
		return func(t *testing.T) {
			r := openRaw(t, sock, ns)
			if cq := r.do(shm.SQE{Op: shm.OpNop}); cq[0].Status != shm.StatusOK {
				t.Fatalf("nop: %v", cq[0].Status)
			}
			do(r)
			expectClosed(t, r.conn, 3*time.Second)
		}
	}

	cases := []struct {
		name string
		bad  uint64 // expected SessionsBad increase
		run  func(t *testing.T)
	}{
		{"handshake/truncated header", 0, refused(valid[:5], shm.CodeBadRequest)},
		{"handshake/header claims more payload", 0, refused(valid[:len(valid)-10], shm.CodeBadRequest)},
		{"handshake/header claims less payload", 0, refused(append(append([]byte{}, valid...), 1, 2, 3), shm.CodeBadRequest)},
		{"handshake/oversized", 0, refused(shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, make([]byte, shm.MaxHelloSize)), shm.CodeBadRequest)},
		{"handshake/wrong magic", 0, func() func(*testing.T) {
			b := append([]byte{}, valid...)
			b[0] ^= 0xff
			return refused(b, shm.CodeBadRequest)
		}()},
		{"handshake/version too new", 0, refused(shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion+1, valid[12:]), shm.CodeVersion)},
		{"handshake/version zero", 0, refused(shm.EncodeMsg(shm.MsgHello, 0, valid[12:]), shm.CodeVersion)},
		{"handshake/client with wrong version", 0, func(t *testing.T) {
			_, err := client.Dial(context.Background(), client.Options{Socket: sock, ProtocolVersion: 99})
			var re *client.RefusedError
			if !errors.As(err, &re) || re.Code != shm.CodeVersion {
				t.Fatalf("dial with version 99: %v, want RefusedError code %d", err, shm.CodeVersion)
			}
		}},
		{"handshake/not a hello", 0, refused(shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, nil), shm.CodeBadRequest)},
		{"handshake/tp_rank >= tp_size", 0, refused(hello(func(h *shm.Hello) { h.Namespace.TPRank, h.Namespace.TPSize = 2, 2 }), shm.CodeBadRequest)},
		{"handshake/zero layers", 0, refused(hello(func(h *shm.Hello) { h.Namespace.Layers = 0 }), shm.CodeBadRequest)},
		{"handshake/unknown dtype", 0, refused(hello(func(h *shm.Hello) { h.Namespace.DType = "fp7" }), shm.CodeBadRequest)},
		{"handshake/block larger than a slab", 0, refused(hello(func(h *shm.Hello) { h.Namespace.BlockBytes = 64 << 20 }), shm.CodeNamespace)},
		{"handshake/unknown hello flags", 0, refused(hello(func(h *shm.Hello) { h.Flags = 0x80 }), shm.CodeBadRequest)},
		{"handshake/control chars in name", 0, refused(hello(func(h *shm.Hello) { h.Name = "a\x00b" }), shm.CodeBadRequest)},
		{"handshake/trailing bytes", 0, refused(shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, append(append([]byte{}, valid[12:]...), 0)), shm.CodeBadRequest)},
		{"handshake/fds attached", 0, func(t *testing.T) {
			// Send 20 copies of a pipe's write end: once the daemon has
			// closed every copy it received, the read end sees EOF.
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			fds := []int{int(pw.Fd())}
			for i := 0; i < 19; i++ {
				fd, err := unix.FcntlInt(pw.Fd(), unix.F_DUPFD_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				fds = append(fds, fd)
			}
			cn := rawDial(t, sock)
			send(t, cn, valid, fds...)
			for _, fd := range fds[1:] {
				unix.Close(fd)
			}
			pw.Close()
			expectRefused(t, cn, shm.CodeBadRequest)
			pr.SetReadDeadline(time.Now().Add(3 * time.Second))
			if n, err := pr.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("pipe read end: n=%d err=%v; the daemon kept a passed fd open", n, err)
			}
		}},
		{"admin/unknown message type", 0, func(t *testing.T) {
			cn := rawDial(t, sock)
			send(t, cn, helloMsg(shm.Namespace{}, shm.HelloFlagAdmin))
			cn.SetReadDeadline(time.Now().Add(5 * time.Second))
			raw, _, err := shm.RecvMsg(cn, make([]byte, 4096), 0)
			if typ, _, _, derr := shm.DecodeMsg(raw); err != nil || derr != nil || typ != shm.MsgWelcome {
				t.Fatalf("admin welcome: %v %v type %d", err, derr, typ)
			}
			send(t, cn, shm.EncodeMsg(shm.MsgType(0x7777), shm.ProtocolVersion, []byte("?")))
			expectClosed(t, cn, 3*time.Second)
		}},
		{"admin/stats request with payload", 0, func(t *testing.T) {
			cn := rawDial(t, sock)
			send(t, cn, helloMsg(shm.Namespace{}, shm.HelloFlagAdmin))
			cn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, _, err := shm.RecvMsg(cn, make([]byte, 4096), 0); err != nil {
				t.Fatal(err)
			}
			send(t, cn, shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, []byte{1}))
			expectClosed(t, cn, 3*time.Second)
		}},
		{"session/garbage control message", 1, func(t *testing.T) {
			r := openRaw(t, sock, ns)
			send(t, r.conn, []byte("not a control message at all"))
			expectClosed(t, r.conn, 3*time.Second)
		}},
		{"ring/unknown op", 1, violation(func(r *rawSession) { r.push(shm.SQE{Op: 0xee, UserData: 9}) })},
		{"ring/op zero", 1, violation(func(r *rawSession) { r.push(shm.SQE{Op: 0, UserData: 9}) })},
		{"ring/unknown flags", 1, violation(func(r *rawSession) { r.push(shm.SQE{Op: shm.OpNop, Flags: 0x40, UserData: 9}) })},
		{"ring/lookup buffer outside data area", 1, violation(func(r *rawSession) {
			r.push(shm.SQE{Op: shm.OpLookup, Count: 1, Buf: r.w.Ring.DataSize - 8, BufLen: 17})
		})},
		{"ring/lookup buffer wraps 32 bits", 1, violation(func(r *rawSession) {
			r.push(shm.SQE{Op: shm.OpLookup, Count: 1, Buf: 0xffff_fff0, BufLen: 0x20})
		})},
		{"ring/lookup more keys than buffer", 1, violation(func(r *rawSession) {
			r.push(shm.SQE{Op: shm.OpLookup, Count: 1 << 30, Buf: 0, BufLen: 17})
		})},
		{"ring/lookup zero keys", 1, violation(func(r *rawSession) { r.push(shm.SQE{Op: shm.OpLookup, Count: 0, Buf: 0, BufLen: 17}) })},
		{"ring/sq tail far ahead of head", 1, violation(func(r *rawSession) {
			r.store(offSQTail, 1+5*r.w.Ring.Entries)
			r.ring.ClientWake()
		})},
		{"ring/sq tail behind head", 1, violation(func(r *rawSession) { r.store(offSQTail, 0xffff_fff0) })},
		{"ring/cq head beyond tail", 1, violation(func(r *rawSession) { r.store(offCQHead, 7) })},
		{"ring/lookup in bounds", 0, func(t *testing.T) {
			r := openRaw(t, sock, ns)
			h := chain(100, 1)[0] // put by the good session, then deleted
			stored := chain(101, 1)[0]
			ctx := context.Background()
			if _, err := good.Put(ctx, stored, payload(stored, bs)); err != nil {
				t.Fatal(err)
			}
			data := r.ring.Data()
			shm.EncodeHash(data[0:], stored)
			shm.EncodeHash(data[16:], h)
			data[32], data[33] = 0xaa, 0xaa
			cq := r.do(shm.SQE{Op: shm.OpLookup, Count: 2, Buf: 0, BufLen: 34})
			if cq[0].Status != shm.StatusOK || cq[0].Value != 1 || data[32] != byte(shm.TierHost) || data[33] != 0 {
				t.Fatalf("lookup: %+v results %v", cq[0], data[32:34])
			}
			if _, err := good.Delete(ctx, stored); err != nil {
				t.Fatal(err)
			}
		}},
		{"ring/double release", 0, func(t *testing.T) {
			r := openRaw(t, sock, ns)
			h := chain(102, 1)[0]
			cq := r.do(shm.SQE{Op: shm.OpReserve, Hash: h})
			if cq[0].Status != shm.StatusOK {
				t.Fatalf("reserve: %v", cq[0].Status)
			}
			if cq = r.do(shm.SQE{Op: shm.OpCommit, Token: cq[0].Value}); cq[0].Status != shm.StatusOK {
				t.Fatalf("commit: %v", cq[0].Status)
			}
			cq = r.do(shm.SQE{Op: shm.OpAcquire, Hash: h})
			if cq[0].Status != shm.StatusOK {
				t.Fatalf("acquire: %v", cq[0].Status)
			}
			tok := cq[0].Value
			cq = r.do(shm.SQE{Op: shm.OpRelease, Token: tok}, shm.SQE{Op: shm.OpRelease, Token: tok})
			if cq[0].Status != shm.StatusOK || cq[1].Status != shm.StatusNoToken {
				t.Fatalf("release, release: %v, %v; want ok, no token", cq[0].Status, cq[1].Status)
			}
			if cq = r.do(shm.SQE{Op: shm.OpDelete, Hash: h}); cq[0].Status != shm.StatusOK {
				t.Fatalf("delete: %v", cq[0].Status)
			}
		}},
		{"ring/commit, abort, release without a token", 0, func(t *testing.T) {
			r := openRaw(t, sock, ns)
			cq := r.do(shm.SQE{Op: shm.OpCommit, Token: 1}, shm.SQE{Op: shm.OpAbort, Token: 0},
				shm.SQE{Op: shm.OpRelease, Token: 1 << 63}, shm.SQE{Op: shm.OpCommit, Token: ^uint64(0)})
			for i := range cq {
				if cq[i].Status != shm.StatusNoToken {
					t.Fatalf("entry %d: %v, want no token", i, cq[i].Status)
				}
			}
			h := chain(103, 1)[0]
			cq = r.do(shm.SQE{Op: shm.OpReserve, Hash: h})
			tok := cq[0].Value
			cq = r.do(shm.SQE{Op: shm.OpCommit, Token: tok}, shm.SQE{Op: shm.OpCommit, Token: tok}, shm.SQE{Op: shm.OpAbort, Token: tok})
			if cq[0].Status != shm.StatusOK || cq[1].Status != shm.StatusNoToken || cq[2].Status != shm.StatusNoToken {
				t.Fatalf("commit twice, abort: %v %v %v", cq[0].Status, cq[1].Status, cq[2].Status)
			}
			r.do(shm.SQE{Op: shm.OpDelete, Hash: h})
		}},
		{"ring/forged token", 0, func(t *testing.T) {
			a := openRaw(t, sock, ns)
			b := openRaw(t, sock, ns)
			h := chain(104, 1)[0]
			cq := a.do(shm.SQE{Op: shm.OpReserve, Hash: h})
			if cq[0].Status != shm.StatusOK {
				t.Fatal(cq[0].Status)
			}
			tok := cq[0].Value
			// Tokens are per session: b cannot finish a's reservation,
			// whatever number it tries.
			var es []shm.SQE
			for _, f := range []uint64{tok, tok - 1, tok + 1, 1, 2} {
				es = append(es, shm.SQE{Op: shm.OpCommit, Token: f}, shm.SQE{Op: shm.OpAbort, Token: f}, shm.SQE{Op: shm.OpRelease, Token: f})
			}
			for i, c := range b.do(es...) {
				if c.Status != shm.StatusNoToken {
					t.Fatalf("forged entry %d (%v): %v", i, es[i].Op, c.Status)
				}
			}
			if r, err := good.Lookup(context.Background(), []client.Hash{h}); err != nil || r.Hits != 0 {
				t.Fatalf("forged commit made the block visible: %+v %v", r, err)
			}
			if cq = a.do(shm.SQE{Op: shm.OpCommit, Token: tok}); cq[0].Status != shm.StatusOK {
				t.Fatalf("owner's commit after the forgeries: %v", cq[0].Status)
			}
			if r, err := good.Lookup(context.Background(), []client.Hash{h}); err != nil || r.Hits != 1 {
				t.Fatalf("owner's commit not visible: %+v %v", r, err)
			}
			good.Delete(context.Background(), h)
		}},
		{"ring/garbage in header words", 0, func(t *testing.T) {
			r := openRaw(t, sock, ns)
			for off := 0; off < 16; off += 4 { // magic, version, geometry
				r.store(off, 0xdeadbeef)
			}
			r.store(offSQSleep, 0xffffffff)
			r.store(offSQSeq, 0x12345678)
			r.store(offCQSleep, 0xffffffff)
			r.store(offCQSeq, 0x87654321)
			// Keep scribbling on the futex words while using the ring.
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for v := uint32(0); ; v++ {
					select {
					case <-stop:
						return
					default:
					}
					r.store(offSQSeq, v*7919)
					r.store(offSQSleep, v)
					r.store(offCQSeq, ^v)
					time.Sleep(50 * time.Microsecond)
				}
			}()
			for i := 0; i < 50; i++ {
				if cq := r.do(shm.SQE{Op: shm.OpNop}); cq[0].Status != shm.StatusOK {
					t.Fatalf("nop %d: %v", i, cq[0].Status)
				}
			}
			roundTrip(t, good, 105)
			close(stop)
			<-done
			if cq := r.do(shm.SQE{Op: shm.OpNop}); cq[0].Status != shm.StatusOK {
				t.Fatal(cq[0].Status)
			}
		}},
		{"ring/completions never drained", 0, func(t *testing.T) {
			r := openRaw(t, sock, ns)
			n := int(r.w.Ring.Entries)
			es := make([]shm.SQE, n)
			for i := range es {
				es[i] = shm.SQE{Op: shm.OpNop, UserData: uint64(i + 1)}
			}
			r.push(es...)
			// Wait until the daemon took the whole first batch (its
			// completions fill the CQ), then fill the SQ again.
			deadline := time.Now().Add(5 * time.Second)
			for r.ring.ClientSQSpace() != n {
				if time.Now().After(deadline) {
					t.Fatal("daemon did not consume the first batch")
				}
				time.Sleep(time.Millisecond)
			}
			r.push(es...)
			time.Sleep(100 * time.Millisecond)
			roundTrip(t, good, 106) // the stuck session costs others nothing
			if got := len(r.pop(2 * n)); got != 2*n {
				t.Fatalf("popped %d", got)
			}
		}},
		{"client/wrong block size", 0, func(t *testing.T) {
			ctx := context.Background()
			h := chain(107, 2)
			if _, err := good.Put(ctx, h[0], make([]byte, bs-1)); !errors.Is(err, client.ErrBlockSize) {
				t.Fatalf("short put: %v", err)
			}
			if _, err := good.PutBatch(ctx, h, [][]byte{make([]byte, bs), make([]byte, bs+1)}); !errors.Is(err, client.ErrBlockSize) {
				t.Fatalf("long put in a batch: %v", err)
			}
			if err := good.Get(ctx, h[0], make([]byte, 2*bs)); !errors.Is(err, client.ErrBlockSize) {
				t.Fatalf("long get: %v", err)
			}
			if _, err := good.GetBatch(ctx, h, [][]byte{make([]byte, bs), nil}); !errors.Is(err, client.ErrBlockSize) {
				t.Fatalf("nil get in a batch: %v", err)
			}
			if r, err := good.Lookup(ctx, h); err != nil || r.Hits != 0 {
				t.Fatalf("a refused put stored something: %+v %v", r, err)
			}
		}},
	}
	wantBad := base.SessionsBad
	for i, tc := range cases {
		if !t.Run(tc.name, tc.run) {
			continue
		}
		wantBad += tc.bad
		roundTrip(t, good, uint64(1000+i))
		st, _, ok := waitStats(t, c, 2*time.Second, func(st *client.Stats) bool { return st.SessionsBad == wantBad })
		if !ok {
			t.Fatalf("after %q: sessions_closed_hostile = %d, want %d", tc.name, st.SessionsBad, wantBad)
		}
	}

	// The silent peers were dropped at the handshake timeout.
	for _, sc := range silent {
		left := 2*time.Second + 1500*time.Millisecond - time.Since(silentSince)
		expectClosed(t, sc, max(left, 10*time.Millisecond))
	}
	t.Logf("silent peers dropped after %v", time.Since(silentSince))

	st, _, ok := waitStats(t, c, 3*time.Second, func(st *client.Stats) bool {
		return st.Sessions == 1 && st.Tiers[0].Reserved == 0 && st.Tiers[0].Leased == 0
	})
	if !ok {
		t.Fatalf("leftovers: sessions %d tier %+v", st.Sessions, st.Tiers[0])
	}
	if st.SessionsBad != wantBad || wantBad-base.SessionsBad != 11 {
		t.Fatalf("sessions_closed_hostile %d, want %d (+11)", st.SessionsBad, wantBad)
	}
	// Every refused or closed peer's fds are gone.
	deadline := time.Now().Add(2 * time.Second)
	for n := fdCount(t, d.pid()); n > baseFDs; n = fdCount(t, d.pid()) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon holds %d fds, %d before the hostile peers", n, baseFDs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	roundTrip(t, good, 2000)
	c.Close()
	if err := d.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit after the hostile peers: %v", err)
	}
}

// TestHostileUnauthorized: a peer whose uid and gid are not allowed is
// refused before anything else, and the daemon keeps serving.
func TestHostileUnauthorized(t *testing.T) {
	t.Parallel()
	ip := startInProc(t, "16MiB", 4<<20, func(c *daemon.Config) {
		c.Auth.UIDs = []uint32{uint32(os.Getuid()) + 12345}
		c.Auth.GIDs = nil
	})
	_, err := client.Dial(context.Background(), client.Options{Socket: ip.cfg.Socket})
	var re *client.RefusedError
	if !errors.As(err, &re) || re.Code != shm.CodeUnauthorized {
		t.Fatalf("dial: %v, want RefusedError code %d", err, shm.CodeUnauthorized)
	}
	// Raw: the refusal comes before the daemon reads anything.
	cn := rawDial(t, ip.cfg.Socket)
	expectRefused(t, cn, shm.CodeUnauthorized)
	cn = rawDial(t, ip.cfg.Socket)
	_ = shm.SendMsg(cn, helloMsg(testNS("itest", 4096), 0)) // may race the hang-up
	expectRefused(t, cn, shm.CodeUnauthorized)
	st := ip.d.Stats()
	if st.SessionsTotal != 0 || st.Sessions != 0 {
		t.Fatalf("unauthorized peers got sessions: %+v", st)
	}
}
