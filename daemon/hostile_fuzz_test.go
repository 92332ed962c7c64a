package daemon

// A stateful hostile-session fuzzer: hostile sessions drive the real daemon
// with random sequences of well-formed and malformed ring entries and
// control messages while a well-behaved session beside them checks every
// byte it reads. Run it longer with
//
//	go test -run '^TestHostileFuzz$' ./daemon/ -hostile.duration=3m -hostile.seed=N

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

var (
	hostileDuration = flag.Duration("hostile.duration", 3*time.Second, "how long TestHostileFuzz runs")
	hostileSeed     = flag.Uint64("hostile.seed", 0, "TestHostileFuzz's seed (0: from the clock)")
	// The NVMe variant doubles the run (half the duration each), so it
	// runs only on request. It found blocks back after a delete and puts
	// after a delete refused as duplicates (tiers:
	// TestDeletedWhileWrittenDownNeverVisible,
	// TestPutAfterDeleteDuringPromotion).
	hostileNVMe = flag.Bool("hostile.nvme", false, "TestHostileFuzz also runs with an NVMe tier and blocks constantly demoted")
)

// Ring region header offsets (shm/ring.go): a hostile peer knows them.
const (
	hofSQTail  = 64
	hofSQHead  = 128
	hofCQTail  = 256
	hofCQHead  = 320
	hofCQSleep = 384
)

// hostilePayload is the content of a hostile block: a pure function of its
// key (parked or not) so that every lease can be checked.
func hostilePayload(b []byte, parked bool, h shm.Hash) {
	x := h.Hi ^ h.Lo*0x9e3779b97f4a7c15
	if parked {
		x = ^x
	}
	for i := 0; i+8 <= len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^(z>>31))
	}
}

// hkey is a hostile block's key in the model.
type hkey struct {
	parked bool
	h      shm.Hash
}

// hostileModel is what the hostile namespace holds: committed blocks and
// reservations (of every hostile session).
type hostileModel struct {
	committed map[hkey]bool
	reserved  map[hkey]bool
}

// hsess is one hostile session: raw socket, raw ring indices.
type hsess struct {
	t       *testing.T
	conn    *net.UnixConn
	ringReg *shm.Region
	arena   *shm.Region
	ring    *shm.Ring // only for the doorbell and its futex wait
	mem     []byte
	w       shm.Welcome
	entries uint32
	sqOff   int
	cqOff   int
	data    []byte
	tail    uint32 // our submission tail
	head    uint32 // our completion head
	ud      uint64
	// Model of this session's tokens; exact is false once the session
	// replayed stale entries (the model no longer knows what ran).
	res    map[uint64]hkey
	leases map[uint64]leaseInfo
	seen   []uint64 // every token granted, for replays and forgeries
	maxTok uint64   // the highest token granted
	exact  bool     // false once it replayed stale entries
	closed bool
}

type leaseInfo struct {
	k     hkey
	off   uint64
	check bool // its bytes were checked: they must stay until the release
}

func (s *hsess) u32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&s.mem[off]))
}

// openHostile opens a raw session and maps both the arena and the ring.
func openHostile(t *testing.T, socket string, ns shm.Namespace) *hsess {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	h := shm.Hello{PID: uint32(os.Getpid()), Namespace: ns, Name: "hostile"}
	if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, h.Encode())); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
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
	arena, err := shm.MapRegion(fds[0], int64(w.ArenaSize), false)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := shm.MapRegion(fds[1], int64(w.RingSize), false)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := shm.NewRing(reg.Bytes(), w.Ring, false)
	if err != nil {
		t.Fatal(err)
	}
	s := &hsess{t: t, conn: c, ringReg: reg, arena: arena, ring: ring, mem: reg.Bytes(), w: w,
		entries: w.Ring.Entries, sqOff: 512, cqOff: 512 + int(w.Ring.Entries)*shm.SQESize, data: ring.Data(),
		res: map[uint64]hkey{}, leases: map[uint64]leaseInfo{}, exact: true}
	return s
}

// release unmaps and closes everything (the daemon's teardown is its own).
func (s *hsess) release() {
	if !s.closed {
		s.conn.Close()
		s.closed = true
	}
	if s.ringReg != nil {
		s.ringReg.Close()
		s.arena.Close()
		s.ringReg, s.arena = nil, nil
	}
}

// push writes es at our tail and publishes it; it returns the user_data
// of each.
func (s *hsess) push(es []shm.SQE) {
	for i := range es {
		off := s.sqOff + int((s.tail+uint32(i))&(s.entries-1))*shm.SQESize
		es[i].Encode(s.mem[off : off+shm.SQESize])
	}
	s.tail += uint32(len(es))
	s.u32(hofSQTail).Store(s.tail)
	s.ring.ClientWake()
}

// space is how many entries we may push (by the head the daemon published).
func (s *hsess) space() int {
	return int(s.entries - (s.tail - s.u32(hofSQHead).Load()))
}

// pop waits for n completions; false if the daemon closed us or the
// deadline passed (a hang: the caller fails).
func (s *hsess) pop(n int, d time.Duration) ([]shm.CQE, bool) {
	out := make([]shm.CQE, 0, n)
	deadline := time.Now().Add(d)
	for len(out) < n {
		tail := s.u32(hofCQTail).Load()
		for s.head != tail && len(out) < n {
			off := s.cqOff + int(s.head&(s.entries-1))*shm.CQESize
			var c shm.CQE
			c.Decode(s.mem[off : off+shm.CQESize])
			out = append(out, c)
			s.head++
		}
		s.u32(hofCQHead).Store(s.head)
		if len(out) == n {
			break
		}
		if time.Now().After(deadline) {
			return out, false
		}
		s.ring.ClientWait(0, 2*time.Millisecond, nil)
	}
	return out, true
}

// do submits es and waits for their completions, in order.
func (s *hsess) do(es ...shm.SQE) []shm.CQE {
	s.t.Helper()
	for i := range es {
		s.ud++
		es[i].UserData = s.ud
	}
	if s.space() < len(es) {
		s.t.Fatalf("hostile: ring has room for %d, pushing %d", s.space(), len(es))
	}
	s.push(es)
	got, ok := s.pop(len(es), 10*time.Second)
	if !ok {
		s.t.Fatalf("hostile: %d of %d completions within 10s (daemon hung?)", len(got), len(es))
	}
	// Acquires served by a promotion complete out of order.
	first := es[0].UserData
	out := make([]shm.CQE, len(es))
	for _, c := range got {
		i := c.UserData - first
		if c.UserData < first || i >= uint64(len(es)) || out[i].UserData != 0 {
			s.t.Fatalf("hostile: completion with user_data %d, submitted %d..%d", c.UserData, first, first+uint64(len(es))-1)
		}
		out[i] = c
	}
	return out
}

// expectClosed waits for the daemon to hang up on s.
func (s *hsess) expectClosed(d time.Duration) error {
	s.conn.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64<<10)
	for {
		_, fds, err := shm.RecvMsg(s.conn, buf, 4)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err == nil {
			continue // a stats reply
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("daemon did not close the session within %v", d)
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			return fmt.Errorf("want EOF, got %w", err)
		}
		return nil
	}
}

// hostileFuzz is one run's state.
type hostileFuzz struct {
	t       *testing.T
	r       *running
	rng     *rand.Rand
	ns      shm.Namespace
	pool    []shm.Hash
	model   hostileModel
	sess    []*hsess
	nsID    uint32
	others  int // sessions open besides the hostile ones (the good one)
	nvme    bool
	wantBad uint64
	inexact int // open sessions that replayed stale entries
	ops     atomic.Uint64
	kinds   map[string]int
}

func (f *hostileFuzz) key() hkey {
	return hkey{parked: f.rng.IntN(8) == 0, h: f.pool[f.rng.IntN(len(f.pool))]}
}

func (f *hostileFuzz) sqe(op shm.Op, k hkey) shm.SQE {
	e := shm.SQE{Op: op, Hash: k.h}
	if k.parked {
		e.Flags = shm.SQEFlagParked
	}
	return e
}

// token picks a token for a commit/abort/release: one held (of either
// kind), one granted before (a replay), or a forgery.
func (f *hostileFuzz) token(s *hsess, other *hsess) uint64 {
	// A token above the last one granted may be granted by this very
	// batch: then the model could not tell what the entry did.
	fresh := func(t uint64) uint64 {
		if t > s.maxTok && t < 1<<62 {
			return ^t
		}
		return t
	}
	switch f.rng.IntN(6) {
	case 0, 1:
		for t := range s.res {
			return t
		}
	case 2:
		for t := range s.leases {
			return t
		}
	case 3:
		if len(s.seen) > 0 {
			return s.seen[f.rng.IntN(len(s.seen))]
		}
	case 4:
		if other != nil {
			for t := range other.res {
				return fresh(t)
			}
			for t := range other.leases {
				return fresh(t)
			}
		}
	}
	return fresh([]uint64{0, 1, 2, ^uint64(0), 1 << 63, f.rng.Uint64(), f.rng.Uint64N(s.maxTok + 1)}[f.rng.IntN(7)])
}

// wellFormed submits a random batch of well-formed entries and checks
// their completions against the model (when it is exact).
func (f *hostileFuzz) wellFormed(s *hsess, other *hsess) {
	t := f.t
	exact := f.inexact == 0 // the namespace model holds
	n := 1 + f.rng.IntN(min(16, s.space()))
	es := make([]shm.SQE, 0, n)
	type lookupArgs struct {
		keys  []hkey
		buf   uint32
		count int
	}
	lookups := map[int]lookupArgs{}
	dataUsed := uint32(0)
	for len(es) < n {
		switch f.rng.IntN(9) {
		case 0, 1:
			es = append(es, f.sqe(shm.OpReserve, f.key()))
		case 2:
			es = append(es, shm.SQE{Op: shm.OpCommit, Token: f.token(s, other)})
		case 3:
			es = append(es, shm.SQE{Op: shm.OpAbort, Token: f.token(s, other)})
		case 4:
			es = append(es, f.sqe(shm.OpAcquire, f.key()))
		case 5:
			es = append(es, shm.SQE{Op: shm.OpRelease, Token: f.token(s, other)})
		case 6:
			es = append(es, f.sqe(shm.OpDelete, f.key()))
		case 7:
			cnt := 1 + f.rng.IntN(8)
			need := uint32(cnt * (shm.LookupKeySize + 1))
			if dataUsed+need > uint32(len(s.data)) {
				continue
			}
			la := lookupArgs{buf: dataUsed, count: cnt}
			for i := 0; i < cnt; i++ {
				k := hkey{h: f.pool[f.rng.IntN(len(f.pool))]}
				la.keys = append(la.keys, k)
				shm.EncodeHash(s.data[int(dataUsed)+i*shm.LookupKeySize:], k.h)
			}
			lookups[len(es)] = la
			es = append(es, shm.SQE{Op: shm.OpLookup, Count: uint32(cnt), Buf: dataUsed, BufLen: need})
			dataUsed += need
		default:
			es = append(es, shm.SQE{Op: shm.OpNop})
		}
	}
	// Scribble on the data area's unused part while the daemon works (it
	// must copy what it reads once).
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if f.rng.IntN(3) == 0 && int(dataUsed) < len(s.data) {
		wg.Add(1)
		go func(b []byte, seed uint64) {
			defer wg.Done()
			x := seed
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := 0; i+8 <= len(b) && i < 4096; i += 8 {
					x = x*6364136223846793005 + 1442695040888963407
					binary.LittleEndian.PutUint64(b[i:], x)
				}
				runtime.Gosched()
			}
		}(s.data[dataUsed:], f.rng.Uint64())
	}
	cq := s.do(es...)
	close(stop)
	wg.Wait()
	f.ops.Add(uint64(len(es)))
	for i, e := range es {
		c := cq[i]
		k := hkey{parked: e.Flags&shm.SQEFlagParked != 0, h: e.Hash}
		want := shm.Status(0xffff) // unchecked
		switch e.Op {
		case shm.OpReserve:
			if c.Status == shm.StatusOK {
				if c.Offset+uint64(s.w.BlockBytes) > uint64(len(s.arena.Bytes())) {
					t.Fatalf("hostile: reserve slot %d past the arena", c.Offset)
				}
				hostilePayload(s.arena.Bytes()[c.Offset:c.Offset+s.w.BlockBytes], k.parked, k.h)
				s.res[c.Value] = k
				s.seen = append(s.seen, c.Value)
				s.maxTok = max(s.maxTok, c.Value)
			}
			if exact {
				want = shm.StatusOK
				if f.model.committed[k] || f.model.reserved[k] {
					want = shm.StatusExists
				}
				if c.Status == shm.StatusOK {
					f.model.reserved[k] = true
				}
			}
		case shm.OpCommit, shm.OpAbort:
			rk, held := s.res[e.Token]
			want = shm.StatusNoToken
			if held {
				want = shm.StatusOK
				delete(s.res, e.Token)
				delete(f.model.reserved, rk)
				if e.Op == shm.OpCommit {
					f.model.committed[rk] = true
				}
			}
			if !s.exact && (c.Status == shm.StatusNoToken || c.Status == shm.StatusOK) {
				want = c.Status // a replayed entry may have used or granted it
			}
		case shm.OpAcquire:
			if c.Status == shm.StatusOK {
				off := c.Offset
				if off+uint64(s.w.BlockBytes) > uint64(len(s.arena.Bytes())) {
					t.Fatalf("hostile: lease slot %d past the arena", off)
				}
				exp := make([]byte, s.w.BlockBytes)
				hostilePayload(exp, k.parked, k.h)
				// Blocks committed by replayed entries hold what the
				// slot held: only an exact model knows who wrote it.
				if exact && !bytes.Equal(s.arena.Bytes()[off:off+s.w.BlockBytes], exp) {
					t.Fatalf("hostile: lease of %v (parked %v) at %d: wrong bytes", k.h, k.parked, off)
				}
				s.leases[c.Value] = leaseInfo{k: k, off: off, check: exact}
				s.seen = append(s.seen, c.Value)
				s.maxTok = max(s.maxTok, c.Value)
			}
			if exact {
				want = shm.StatusNotFound
				if f.model.committed[k] {
					want = shm.StatusOK
				}
			}
		case shm.OpRelease:
			li, held := s.leases[e.Token]
			want = shm.StatusNoToken
			if held && li.check {
				// A leased slot keeps its block's bytes until released.
				exp := make([]byte, s.w.BlockBytes)
				hostilePayload(exp, li.k.parked, li.k.h)
				if !bytes.Equal(s.arena.Bytes()[li.off:li.off+s.w.BlockBytes], exp) {
					who := "unknown bytes"
					for _, ph := range f.pool {
						for _, pk := range []bool{false, true} {
							hostilePayload(exp, pk, ph)
							if bytes.Equal(s.arena.Bytes()[li.off:li.off+s.w.BlockBytes], exp) {
								who = fmt.Sprintf("the bytes of %v parked %v", ph, pk)
							}
						}
					}
					t.Fatalf("hostile: leased slot %d of %v (parked %v, token %d) changed before its release: %s", li.off, li.k.h, li.k.parked, e.Token, who)
				}
			}
			if held {
				want = shm.StatusOK
				delete(s.leases, e.Token)
			}
			if !s.exact && (c.Status == shm.StatusNoToken || c.Status == shm.StatusOK) {
				want = c.Status
			}
		case shm.OpDelete:
			if exact {
				want = shm.StatusNotFound
				if f.model.committed[k] {
					want = shm.StatusOK
				}
			}
			if c.Status == shm.StatusOK {
				delete(f.model.committed, k)
			}
		case shm.OpLookup:
			la := lookups[i]
			hits := 0
			for hits < la.count && f.model.committed[la.keys[hits]] {
				hits++
			}
			if c.Status != shm.StatusOK || (exact && c.Value != uint64(hits)) {
				t.Fatalf("hostile: lookup of %d keys: status %v hits %d, model %d", la.count, c.Status, c.Value, hits)
			}
			for j := 0; exact && j < la.count; j++ {
				wt := byte(0)
				if j < hits {
					wt = byte(shm.TierHost)
				}
				got := s.data[int(la.buf)+la.count*shm.LookupKeySize+j]
				if f.nvme && wt != 0 && got == byte(shm.TierNVMe) {
					wt = got
				}
				if got != wt {
					t.Fatalf("hostile: lookup result %d is %d, want %d", j, got, wt)
				}
			}
			want = shm.StatusOK
		case shm.OpNop:
			want = shm.StatusOK
		}
		if want != 0xffff && c.Status != want {
			t.Fatalf("hostile: entry %d (%v token %d hash %v parked %v exact %v): status %v, want %v",
				i, e.Op, e.Token, e.Hash, k.parked, exact, c.Status, want)
		}
		// Keep what the session holds bounded: the tier is shared.
	}
	if len(s.res)+len(s.leases) > 48 {
		f.tidy(s)
	}
}

// tidy aborts this session's reservations and releases its leases.
func (f *hostileFuzz) tidy(s *hsess) {
	var es []shm.SQE
	for tok := range s.res {
		es = append(es, shm.SQE{Op: shm.OpAbort, Token: tok})
	}
	for tok := range s.leases {
		es = append(es, shm.SQE{Op: shm.OpRelease, Token: tok})
	}
	for len(es) > 0 {
		n := min(len(es), s.space())
		cq := s.do(es[:n]...)
		for i, c := range cq {
			if c.Status != shm.StatusOK && (s.exact || c.Status != shm.StatusNoToken) {
				f.t.Fatalf("hostile: tidy %v of token %d: %v", es[i].Op, es[i].Token, c.Status)
			}
			if es[i].Op == shm.OpAbort {
				delete(f.model.reserved, s.res[es[i].Token])
				delete(s.res, es[i].Token)
			} else {
				delete(s.leases, es[i].Token)
			}
		}
		es = es[n:]
	}
}

// sessionsNow is the number of sessions the daemon holds.
func (f *hostileFuzz) sessionsNow() int {
	f.r.d.mu.Lock()
	defer f.r.d.mu.Unlock()
	return len(f.r.d.sessions)
}

// forget drops a closed session from the model once the daemon has torn it
// down (its reservations aborted).
func (f *hostileFuzz) forget(s *hsess, bad bool) {
	t := f.t
	if bad {
		f.wantBad++
		if err := s.expectClosed(10 * time.Second); err != nil {
			t.Fatalf("hostile session not closed after a protocol violation: %v", err)
		}
	}
	s.release()
	for i, o := range f.sess {
		if o == s {
			f.sess = append(f.sess[:i], f.sess[i+1:]...)
			break
		}
	}
	want := f.others + len(f.sess) // the good session and the other hostile ones
	deadline := time.Now().Add(10 * time.Second)
	for f.sessionsNow() != want {
		if time.Now().After(deadline) {
			t.Fatalf("daemon holds %d sessions, want %d, 10s after a hostile session closed", f.sessionsNow(), want)
		}
		time.Sleep(time.Millisecond)
	}
	if got := f.r.d.sessionsBad.Load(); got != f.wantBad {
		t.Fatalf("sessions closed as hostile: %d, want %d (last: bad=%v)", got, f.wantBad, bad)
	}
	for _, k := range s.res {
		delete(f.model.reserved, k)
	}
	if !s.exact {
		f.inexact--
	}
	f.resync()
}

// resync: once no session that replayed stale entries is open, the model is
// made exact again by emptying the namespace (what the replays committed is
// unknown) and taking the reservations the open sessions hold.
func (f *hostileFuzz) resync() {
	if f.inexact > 0 {
		return
	}
	f.r.d.deleteNS(f.nsID)
	f.model.committed = map[hkey]bool{}
	f.model.reserved = map[hkey]bool{}
	for _, o := range f.sess {
		for _, k := range o.res {
			f.model.reserved[k] = true
		}
	}
}

// malformed breaks the protocol in one of many ways, after a few
// well-formed entries in the same batch; the daemon must close the session.
func (f *hostileFuzz) malformed(s *hsess) string {
	pre := make([]shm.SQE, f.rng.IntN(4))
	for i := range pre {
		pre[i] = shm.SQE{Op: shm.OpNop, UserData: uint64(i)}
	}
	entry := func(e shm.SQE) { s.push(append(pre, e)) }
	dl := uint32(len(s.data))
	switch k := f.rng.IntN(12); k {
	case 0:
		entry(shm.SQE{Op: shm.Op(9 + f.rng.IntN(247))})
		return "unknown op"
	case 1:
		entry(shm.SQE{Op: 0})
		return "op zero"
	case 2:
		entry(shm.SQE{Op: shm.OpNop, Flags: uint8(1 + f.rng.IntN(255))})
		return "flags on nop"
	case 3:
		entry(shm.SQE{Op: shm.OpReserve, Flags: 1 << (2 + f.rng.IntN(6))})
		return "unknown reserve flag"
	case 4:
		entry(shm.SQE{Op: shm.OpLookup, Count: 1<<12 + f.rng.Uint32N(1<<31), Buf: 0, BufLen: dl})
		return "huge lookup count"
	case 5:
		entry(shm.SQE{Op: shm.OpLookup, Count: 1, Buf: dl - f.rng.Uint32N(17), BufLen: 17})
		return "lookup past the data area"
	case 6:
		entry(shm.SQE{Op: shm.OpLookup, Count: 1, Buf: ^uint32(0) - f.rng.Uint32N(64), BufLen: 0x40})
		return "lookup buffer wraps"
	case 7:
		entry(shm.SQE{Op: shm.OpLookup, Count: 0, BufLen: 17})
		return "lookup of zero keys"
	case 8:
		s.u32(hofSQTail).Store(s.tail + s.entries + 1 + f.rng.Uint32N(1<<30))
		s.ring.ClientWake()
		return "sq tail past the ring"
	case 9:
		s.u32(hofSQTail).Store(s.tail - 1 - f.rng.Uint32N(1<<20))
		s.ring.ClientWake()
		return "sq tail behind its head"
	case 10:
		// Completion head past the tail, then an entry so the loop looks.
		s.u32(hofCQHead).Store(s.head + 1 + f.rng.Uint32N(1<<20))
		entry(shm.SQE{Op: shm.OpNop})
		return "cq head past its tail"
	default:
		msgs := [][]byte{
			[]byte("garbage on the control socket"),
			shm.EncodeMsg(shm.MsgType(0x7777), shm.ProtocolVersion, []byte{1}),
			shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, []byte{1, 2}),
			shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, nil),
		}
		shm.SendMsg(s.conn, msgs[f.rng.IntN(len(msgs))])
		return "malformed control message"
	}
}

// replay publishes a tail past entries it did not write again: the daemon
// runs what the ring slots held (earlier, well-formed entries).
func (f *hostileFuzz) replay(s *hsess) bool {
	if s.tail < s.entries {
		return false // slots never written hold op 0: a violation
	}
	k := 1 + f.rng.IntN(min(32, s.space()))
	s.tail += uint32(k)
	s.u32(hofSQTail).Store(s.tail)
	s.ring.ClientWake()
	if s.exact {
		s.exact = false
		f.inexact++
	}
	cq, ok := s.pop(k, 10*time.Second)
	if !ok {
		f.t.Fatalf("hostile: %d of %d replayed completions within 10s", len(cq), k)
	}
	for _, c := range cq {
		// Fresh grants from replays are unknown to us; they are freed at
		// close. Keep the token numbers for later forgeries.
		if c.Status == shm.StatusOK && c.Value != 0 && c.Value < 1<<32 {
			s.seen = append(s.seen, c.Value)
			s.maxTok = max(s.maxTok, c.Value)
		}
	}
	f.ops.Add(uint64(k))
	return true
}

// flipCQHead moves the published completion head back and forth (within
// what the protocol allows) while the daemon answers a batch of nops.
func (f *hostileFuzz) flipCQHead(s *hsess) {
	m := 1 + f.rng.IntN(min(8, s.space()))
	es := make([]shm.SQE, m)
	for i := range es {
		s.ud++
		es[i] = shm.SQE{Op: shm.OpNop, UserData: s.ud}
	}
	s.push(es)
	for i := 0; i < 50; i++ {
		j := f.rng.Uint32N(s.entries - uint32(m) + 1)
		s.u32(hofCQHead).Store(s.head - j)
		if i%8 == 0 {
			runtime.Gosched()
		}
	}
	s.u32(hofCQHead).Store(s.head)
	cq, ok := s.pop(m, 10*time.Second)
	if !ok {
		f.t.Fatalf("hostile: %d of %d completions within 10s after flipping the cq head", len(cq), m)
	}
	for i, c := range cq {
		if c.UserData != es[i].UserData || c.Status != shm.StatusOK {
			f.t.Fatalf("hostile: nop %d after cq head flips: %+v", i, c)
		}
	}
	f.ops.Add(uint64(m))
}

// overfill submits more entries than the completion ring holds and drains
// only after the daemon stopped taking them.
func (f *hostileFuzz) overfill(s *hsess) {
	total := 0
	var uds []uint64
	for round := 0; round < 2; round++ {
		n := s.space()
		es := make([]shm.SQE, n)
		for i := range es {
			s.ud++
			es[i] = shm.SQE{Op: shm.OpNop, UserData: s.ud}
			uds = append(uds, s.ud)
		}
		s.push(es)
		total += n
		if round == 0 {
			deadline := time.Now().Add(10 * time.Second)
			for s.space() != int(s.entries) {
				if time.Now().After(deadline) {
					f.t.Fatal("hostile: daemon did not take a full ring of nops")
				}
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	cq, ok := s.pop(total, 10*time.Second)
	if !ok {
		f.t.Fatalf("hostile: %d of %d completions of an overfilled ring", len(cq), total)
	}
	for i, c := range cq {
		if c.UserData != uds[i] {
			f.t.Fatalf("hostile: overfill completion %d has user_data %d, want %d", i, c.UserData, uds[i])
		}
	}
	f.ops.Add(uint64(total))
}

// stats asks for the daemon's stats on the session socket (allowed).
func (f *hostileFuzz) stats(s *hsess) {
	if err := shm.SendMsg(s.conn, shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, nil)); err != nil {
		f.t.Fatalf("hostile: stats request: %v", err)
	}
	s.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, _, err := shm.RecvMsg(s.conn, make([]byte, shm.MaxControlMsg), 0)
	s.conn.SetReadDeadline(time.Time{})
	if err != nil {
		f.t.Fatalf("hostile: stats reply: %v", err)
	}
	if typ, _, _, err := shm.DecodeMsg(raw); err != nil || typ != shm.MsgStatsReply {
		f.t.Fatalf("hostile: stats reply type %d: %v", typ, err)
	}
}

// raceClose submits entries and closes at once, unmapping the ring.
func (f *hostileFuzz) raceClose(s *hsess) {
	n := 1 + f.rng.IntN(min(16, s.space()))
	es := make([]shm.SQE, n)
	for i := range es {
		switch f.rng.IntN(4) {
		case 0:
			es[i] = f.sqe(shm.OpReserve, f.key())
		case 1:
			es[i] = shm.SQE{Op: shm.OpCommit, Token: f.token(s, nil)}
		case 2:
			es[i] = f.sqe(shm.OpAcquire, f.key())
		default:
			es[i] = shm.SQE{Op: shm.OpRelease, Token: f.token(s, nil)}
		}
	}
	s.push(es)
	if s.exact { // what ran before the close is unknown
		s.exact = false
		f.inexact++
	}
	f.ops.Add(uint64(n))
}

// goodSession is the well-behaved session: every answer must be exact.
func goodSession(ctx context.Context, socket string, hashes []shm.Hash, deadline time.Duration, ops *atomic.Uint64, rng *rand.Rand) error {
	c, err := client.Dial(ctx, client.Options{Socket: socket, Name: "good"})
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	ns := client.Namespace{ModelID: "hostile-fuzz-good", Layers: 1, KVHeads: 1, HeadDim: 64, DType: "bf16",
		TokensPerBlock: 16, TPSize: 1, BlockBytes: 4096}
	s, err := c.Open(ctx, ns)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer s.Close()
	present := map[shm.Hash]bool{}
	want := make([]byte, 4096)
	got := make([]byte, 4096)
	call := func(name string, f func(ctx context.Context) error) error {
		cctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		t0 := time.Now()
		if err := f(cctx); err != nil {
			return fmt.Errorf("%s after %v: %w", name, time.Since(t0), err)
		}
		ops.Add(1)
		return nil
	}
	for ctx.Err() == nil {
		h := hashes[rng.IntN(len(hashes))]
		var err error
		switch rng.IntN(4) {
		case 0:
			err = call("put", func(ctx context.Context) error {
				hostilePayload(want, false, h)
				stored, err := s.Put(ctx, h, want)
				if err == nil && stored == present[h] {
					err = fmt.Errorf("stored=%v with the block present=%v", stored, present[h])
				}
				present[h] = true
				return err
			})
		case 1:
			err = call("get", func(ctx context.Context) error {
				err := s.Get(ctx, h, got)
				switch {
				case present[h] && err != nil:
					return fmt.Errorf("block put before: %w", err)
				case !present[h] && !errors.Is(err, client.ErrNotFound):
					return fmt.Errorf("block absent, got %v", err)
				case present[h]:
					hostilePayload(want, false, h)
					if !bytes.Equal(got, want) {
						return errors.New("wrong bytes")
					}
				}
				return nil
			})
		case 2:
			err = call("lookup", func(ctx context.Context) error {
				i := rng.IntN(len(hashes))
				ch := hashes[i:min(len(hashes), i+1+rng.IntN(6))]
				r, err := s.Lookup(ctx, ch)
				if err != nil {
					return err
				}
				hits := 0
				for hits < len(ch) && present[ch[hits]] {
					hits++
				}
				if r.Hits != hits {
					return fmt.Errorf("%d hits, want %d", r.Hits, hits)
				}
				return nil
			})
		default:
			err = call("delete", func(ctx context.Context) error {
				ok, err := s.Delete(ctx, h)
				if err == nil && ok != present[h] {
					err = fmt.Errorf("deleted=%v with the block present=%v", ok, present[h])
				}
				delete(present, h)
				return err
			})
		}
		if err != nil {
			return err
		}
	}
	// Leave the tier as we found it.
	cctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var hs []shm.Hash
	for h := range present {
		hs = append(hs, h)
	}
	if n, err := s.DeleteBatch(cctx, hs); err != nil || n != len(hs) {
		return fmt.Errorf("final delete: %d of %d: %v", n, len(hs), err)
	}
	return nil
}

// TestHostileFuzz: hostile sessions drive the daemon with random sequences
// of well-formed, replayed, forged and malformed entries, index flips,
// control messages and racing closes, checked against a model of their
// namespace, while a good session's every answer is checked exactly.
// Afterwards the daemon's accounting is back at its baseline.
func TestHostileFuzz(t *testing.T) {
	for _, nvme := range []bool{false, true} {
		if nvme && !*hostileNVMe {
			continue
		}
		t.Run(map[bool]string{false: "host", true: "nvme"}[nvme], func(t *testing.T) { hostileFuzzRun(t, nvme) })
	}
}

// hostileFuzzRun is one TestHostileFuzz run; with nvme the host tier's
// watermarks are set so low that blocks keep moving down to NVMe and
// acquires are served by promotions (completed out of order, from the
// movers).
func hostileFuzzRun(t *testing.T, nvme bool) {
	cfg := testConfig(t) // 8 MiB host tier, 1 MiB slabs
	cfg.Session.RingEntries = 64
	cfg.Session.DataBytes = 64 * KiB
	if nvme {
		cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 64*MiB, false
		cfg.Host.HighWatermark, cfg.Host.LowWatermark = 0.02, 0.01
		cfg.Host.Policy = "lru" // admits every block: none may be dropped
	}
	log := &syncBuffer{}
	r := startDaemon(t, cfg, slog.New(slog.NewTextHandler(log, nil)))
	defer func() {
		if t.Failed() {
			t.Logf("daemon log (tail):\n%s", tail(log.String(), 8000))
			if r.d.nvme != nil {
				t.Logf("nvme %+v", r.d.nvme.Stats())
			}
			t.Logf("chain %+v", r.d.chain.Stats())
			t.Logf("host %+v", r.d.host.Stats())
		}
	}()
	seed := *hostileSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (-hostile.seed), -hostile.duration %v", seed, *hostileDuration)
	hs0 := r.d.host.Stats()
	ev0 := r.d.Stats().Tiers[0].Evictions

	var pool []shm.Hash
	for i := range 24 {
		pool = append(pool, testHash(i))
	}
	f := &hostileFuzz{t: t, r: r, rng: rand.New(rand.NewPCG(seed, 1)),
		ns: shm.Namespace{ModelID: "hostile-fuzz-bad", Layers: 1, KVHeads: 1, HeadDim: 64, DType: "bf16",
			TokensPerBlock: 16, TPSize: 1, BlockBytes: 8192},
		pool:  append(pool, testHash(1000), testHash(1001)),
		model: hostileModel{committed: map[hkey]bool{}, reserved: map[hkey]bool{}},
		kinds: map[string]int{}, nvme: nvme}

	// Run starts its own goroutines (probes, notify) before it accepts: a
	// first session, opened and closed, makes the baseline steady.
	warm := openHostile(t, cfg.Socket, f.ns)
	f.nsID = warm.w.NamespaceID
	f.sess = append(f.sess, warm)
	f.forget(warm, false)
	goroutines0 := runtime.NumGoroutine()

	ctx, cancel := context.WithCancel(context.Background())
	var goodOps atomic.Uint64
	goodErr := make(chan error, 1)
	go func() {
		goodErr <- goodSession(ctx, cfg.Socket, pool, 5*time.Second, &goodOps, rand.New(rand.NewPCG(seed, 2)))
	}()
	// The good session is open before the hostile ones count sessions.
	for deadline := time.Now().Add(10 * time.Second); f.sessionsNow() < 1; {
		if time.Now().After(deadline) {
			t.Fatal("good session did not open")
		}
		time.Sleep(time.Millisecond)
	}
	f.others = 1
	runs := time.Duration(1)
	if *hostileNVMe {
		runs = 2
	}
	end := time.Now().Add(*hostileDuration / runs)
	steps := 0
	for time.Now().Before(end) {
		select {
		case err := <-goodErr:
			cancel()
			t.Fatalf("good session: %v", err)
		default:
		}
		for len(f.sess) < 2 {
			s := openHostile(t, cfg.Socket, f.ns)
			f.sess = append(f.sess, s)
			if f.nsID == 0 {
				f.nsID = s.w.NamespaceID
			}
		}
		i := f.rng.IntN(len(f.sess))
		s, other := f.sess[i], f.sess[1-i]
		steps++
		switch a := f.rng.IntN(40); {
		case a < 24:
			f.kinds["well-formed"]++
			f.wellFormed(s, other)
		case a < 26:
			if f.replay(s) {
				f.kinds["replay"]++
			}
		case a < 28:
			f.kinds["flip cq head"]++
			f.flipCQHead(s)
		case a < 29:
			f.kinds["overfill"]++
			f.overfill(s)
		case a < 30:
			f.kinds["stats"]++
			f.stats(s)
		case a < 33:
			f.kinds["malformed: "+f.malformed(s)]++
			f.forget(s, true)
		case a < 35:
			f.kinds["racing close"]++
			f.raceClose(s)
			f.forget(s, false)
		case a < 37:
			f.kinds["close"]++
			f.forget(s, false)
		default:
			if !s.exact && len(s.res)+len(s.leases) == 0 {
				f.kinds["close inexact"]++
				f.forget(s, false)
			} else {
				f.kinds["tidy"]++
				f.tidy(s)
			}
		}
	}
	for len(f.sess) > 0 {
		f.forget(f.sess[0], false)
	}
	cancel()
	if err := <-goodErr; err != nil {
		t.Fatalf("good session: %v", err)
	}
	f.others = 0
	f.r.d.deleteNS(f.nsID)
	t.Logf("%d steps, %d hostile entries, %d good calls, %d hostile closes; %v",
		steps, f.ops.Load(), goodOps.Load(), f.wantBad, f.kinds)

	// Back to the baseline: no session, nothing reserved, leased or stored,
	// the ring loops' goroutines gone. The reservations hostile sessions
	// left open are quarantined (this process lives on); the peers have
	// unmapped the arena, so no late copy can come: end the holds.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.d.quar.expireAll()
		hs := r.d.host.Stats()
		n := f.sessionsNow()
		g := runtime.NumGoroutine()
		nb := 0
		if r.d.nvme != nil {
			nb = r.d.nvme.Stats().Blocks
		}
		if n == 0 && hs.Reserved == 0 && hs.Leased == 0 && hs.UsedBytes == hs0.UsedBytes && hs.Blocks == hs0.Blocks && nb == 0 && g <= goroutines0 {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
			t.Fatalf("10s after the last session: sessions %d, reserved %d, leased %d, used %d (was %d), blocks %d (was %d), nvme blocks %d, goroutines %d (was %d)",
				n, hs.Reserved, hs.Leased, hs.UsedBytes, hs0.UsedBytes, hs.Blocks, hs0.Blocks, nb, g, goroutines0)
		}
		time.Sleep(time.Millisecond)
	}
	if ev := r.d.Stats().Tiers[0].Evictions; ev != ev0 {
		t.Fatalf("%d evictions from the host tier: it was never full", ev-ev0)
	}
	if got := r.d.sessionsBad.Load(); got != f.wantBad {
		t.Fatalf("sessions closed as hostile: %d, want %d", got, f.wantBad)
	}
	if !strings.Contains(log.String(), "peer broke the protocol") && f.wantBad > 0 {
		t.Fatal("no protocol violation logged")
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
