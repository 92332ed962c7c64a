package daemon

// A hostile session peer on a raw socket and a raw ring.

import (
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
)

// rawPeer is a hostile session peer: raw socket, raw ring.
type rawPeer struct {
	t    *testing.T
	conn *net.UnixConn
	w    shm.Welcome
	reg  *shm.Region
	ring *shm.Ring
}

func rawHello(ns shm.Namespace) []byte {
	h := shm.Hello{PID: uint32(os.Getpid()), Namespace: ns, Name: "raw-raw"}
	return shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, h.Encode())
}

func rawDial(t *testing.T, socket string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawOpen sends a hello and reads the daemon's answer to a hello: the Welcome (mapping the
// ring) or a refusal code.
func rawOpen(t *testing.T, socket string, ns shm.Namespace) (*rawPeer, shm.ErrCode) {
	t.Helper()
	c := rawDial(t, socket)
	if err := shm.SendMsg(c, rawHello(ns)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, fds, err := shm.RecvMsg(c, make([]byte, 64<<10), shm.WelcomeFDs)
	if err != nil {
		t.Fatalf("welcome: %v", err)
	}
	c.SetReadDeadline(time.Time{})
	typ, _, p, err := shm.DecodeMsg(raw)
	if err != nil {
		t.Fatal(err)
	}
	if typ == shm.MsgError {
		e, err := shm.DecodeError(p)
		if err != nil {
			t.Fatal(err)
		}
		return nil, e.Code
	}
	if typ != shm.MsgWelcome || len(fds) != shm.WelcomeFDs {
		t.Fatalf("welcome: type %d fds %d", typ, len(fds))
	}
	w, err := shm.DecodeWelcome(p)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fds[0])
	reg, err := shm.MapRegion(fds[1], int64(w.RingSize), false)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := shm.NewRing(reg.Bytes(), w.Ring, false)
	if err != nil {
		t.Fatal(err)
	}
	r := &rawPeer{t: t, conn: c, w: w, reg: reg, ring: ring}
	t.Cleanup(func() { c.Close(); time.Sleep(10 * time.Millisecond); reg.Close() })
	return r, 0
}

// do submits es (at most the ring size) and waits for their completions.
func (r *rawPeer) do(es ...shm.SQE) []shm.CQE {
	r.t.Helper()
	if n := r.ring.ClientPush(es); n != len(es) {
		r.t.Fatalf("pushed %d of %d", n, len(es))
	}
	r.ring.ClientWake()
	out := make([]shm.CQE, len(es))
	got := 0
	deadline := time.Now().Add(10 * time.Second)
	for got < len(out) {
		got += r.ring.ClientPop(out[got:])
		if got < len(out) {
			if time.Now().After(deadline) {
				r.t.Fatalf("%d of %d completions after 10s", got, len(out))
			}
			r.ring.ClientWait(0, 5*time.Millisecond, nil)
		}
	}
	return out
}

func rawNS(model string, bs uint64) shm.Namespace {
	return shm.Namespace{ModelID: model, Layers: 1, KVHeads: 1, HeadDim: 64, DType: "bf16",
		TokensPerBlock: 16, TPSize: 1, BlockBytes: bs}
}

// TestLeasesBoundedPerSession: acquiring the same committed block again and
// again gives a new token each time and the session's lease map grows
// without any bound: a hostile client makes the daemon allocate at will
// (one map entry per acquire; no tier capacity limits leases on one block).
func TestLeasesBoundedPerSession(t *testing.T) {
	cfg := testConfig(t)
	startDaemon(t, cfg, slog.New(slog.DiscardHandler))
	p, code := rawOpen(t, cfg.Socket, rawNS("raw-leases", 4096))
	if p == nil {
		t.Fatalf("refused: %d", code)
	}
	h := shm.Hash{Hi: 1, Lo: 2}
	cq := p.do(shm.SQE{Op: shm.OpReserve, Hash: h, UserData: 1})
	if cq[0].Status != shm.StatusOK {
		t.Fatal(cq[0].Status)
	}
	if cq = p.do(shm.SQE{Op: shm.OpCommit, Token: cq[0].Value, UserData: 2}); cq[0].Status != shm.StatusOK {
		t.Fatal(cq[0].Status)
	}
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	n := int(p.w.Ring.Entries)
	es := make([]shm.SQE, n)
	for i := range es {
		es[i] = shm.SQE{Op: shm.OpAcquire, Hash: h, UserData: uint64(i + 1)}
	}
	const total = 1 << 18 // 262144 acquires of one 4 KiB block
	ok := 0
	for done := 0; done < total; done += n {
		for _, c := range p.do(es...) {
			if c.Status == shm.StatusOK {
				ok++
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	held := ok // none released: every OK acquire is a token the session keeps
	t.Logf("%d acquires of one block: %d ok, session holds %d leases, heap grew %d MiB",
		total, ok, held, (int64(ms1.HeapInuse)-int64(ms0.HeapInuse))>>20)
	// The host tier holds 8 MiB / 4 KiB = 2048 blocks; a session can
	// legitimately need a lease per block plus a ring's worth in flight.
	bound := int(cfg.Host.Capacity)/4096 + n
	if held > bound {
		t.Fatalf("session holds %d leases on a single block (bound %d): tokens are unbounded", held, bound)
	}
}

// TestRefusedHelloRegistersNothing: a hello the daemon refuses (its
// block is larger than a slab, or the session limit is reached) still
// registers its namespace for good: an id is spent and namespaces.json
// rewritten and fsynced for a peer that never gets a session, so refused
// handshakes alone can fill the registry (maxNamespaces) past restarts.
func TestRefusedHelloRegistersNothing(t *testing.T) {
	cfg := testConfig(t) // 1 MiB slabs
	cfg.Session.MaxSessions = 1
	r := startDaemon(t, cfg, slog.New(slog.DiscardHandler))
	if p, code := rawOpen(t, cfg.Socket, rawNS("raw-first", 4096)); p == nil {
		t.Fatalf("first session refused: %d", code)
	}
	if p, code := rawOpen(t, cfg.Socket, rawNS("raw-too-large", 2<<20)); p != nil || code != shm.CodeNamespace {
		t.Fatalf("block over a slab: session %v code %d, want refused %d", p != nil, code, shm.CodeNamespace)
	}
	if p, code := rawOpen(t, cfg.Socket, rawNS("raw-over-limit", 4096)); p != nil || code != shm.CodeBusy {
		t.Fatalf("over the session limit: session %v code %d, want refused %d", p != nil, code, shm.CodeBusy)
	}
	for id, spec := range r.d.reg.All() {
		if spec.ModelID != "raw-first" {
			t.Errorf("refused hello registered namespace %d (%s, block_bytes %d)", id, spec.ModelID, spec.BlockBytes)
		}
	}
}

// TestSleepingLoopsDoNotSpin: d.spinners counts the ring loops spinning,
// which spinLimit caps. A loop used to count itself for its futex sleep
// too, so idle sessions asleep on their doorbells took every slot and, with
// more loops than maxHot, no session could spin at all, however hot.
func TestSleepingLoopsDoNotSpin(t *testing.T) {
	cfg := testConfig(t) // spin_us 200
	r := startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), func(d *Daemon) {
		d.maxHot, d.maxSpinners = 2, 1 // a 2-CPU host
	})
	for i := range 3 {
		p, code := rawOpen(t, cfg.Socket, rawNS("raw-spin", 4096))
		if p == nil {
			t.Fatalf("session %d refused: %d", i, code)
		}
		p.do(shm.SQE{Op: shm.OpNop, UserData: 1})
	}
	// Every loop is idle: its spin (200 µs, at most 20x that in wall time)
	// is long over and it sleeps on its doorbell.
	time.Sleep(200 * time.Millisecond)
	// An idle loop still spins briefly after each sleepBound timeout, so
	// look at the average over many samples: asleep, it must not count.
	const samples = 200
	var sum int32
	for range samples {
		sum += r.d.spinners.Load()
		time.Sleep(500 * time.Microsecond)
	}
	if avg := float64(sum) / samples; avg > 0.5 {
		t.Fatalf("3 idle sessions asleep on their doorbells: spinners = %.2f on average, want ~0; "+
			"spinLimit is %d, so no loop may spin any more", avg, r.d.spinLimit(false))
	}
}

// TestBadControlMessageCountedHostile: a session peer that sends fds
// (SCM_RIGHTS), more control data than fits (MSG_CTRUNC) or a datagram
// larger than a control message (MSG_TRUNC) on its socket breaks the
// protocol. The session was closed as if the peer had hung up: not counted
// in sessions_closed_hostile, no reason logged. The fds it passed must be
// closed, not kept: a pipe whose write end was sent reads EOF only once
// every copy is closed.
func TestBadControlMessageCountedHostile(t *testing.T) {
	cfg := testConfig(t)
	logs := &syncBuffer{}
	r := startDaemon(t, cfg, slog.New(slog.NewTextHandler(logs, nil)))
	stats := shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, nil)
	for i, tc := range []struct {
		name   string
		msg    []byte
		fds    int // copies of a pipe's write end attached
		reason string
	}{
		{"fd attached", stats, 1, "unexpected file descriptors"},
		{"control data truncated", stats, 64, "control data truncated"},
		{"datagram truncated", make([]byte, 3*shm.MaxHelloSize), 0, "message larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, code := rawOpen(t, cfg.Socket, rawNS("raw-cmsg", 4096))
			if p == nil {
				t.Fatalf("refused: %d", code)
			}
			bad := r.d.sessionsBad.Load()
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			fds := make([]int, tc.fds)
			for j := range fds {
				fds[j] = int(pw.Fd())
			}
			err = shm.SendMsg(p.conn, tc.msg, fds...)
			pw.Close()
			if err != nil {
				t.Fatal(err)
			}
			// The daemon counts the session before it closes the socket.
			p.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := p.conn.Read(make([]byte, 64)); n != 0 || err == nil {
				t.Fatalf("session socket still open: read %d bytes, %v", n, err)
			}
			if got := r.d.sessionsBad.Load() - bad; got != 1 {
				t.Errorf("sessions closed as hostile rose by %d, want 1", got)
			}
			pr.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := pr.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				t.Errorf("the pipe's write end is still open after the session closed (read %d, %v): the daemon kept a passed fd", n, err)
			}
			if want := "closing session: peer broke the protocol"; strings.Count(logs.String(), want) != i+1 ||
				!strings.Contains(logs.String(), tc.reason) {
				t.Errorf("log does not say why (want %q with %q):\n%s", want, tc.reason, logs.String())
			}
		})
	}
}
