package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
)

func closeFD(fd int) { unix.Close(fd) }

// call is one submitted entry waiting for its completion.
type call struct {
	op        shm.Op
	cqe       shm.CQE
	err       error // set when the connection died before completion
	done      chan struct{}
	abandoned bool   // caller gave up (context); guarded by conn.pmu
	late      func() // with abandoned: runs once the completion arrived
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func getCall(op shm.Op) *call {
	c := callPool.Get().(*call)
	c.op, c.cqe, c.err, c.abandoned, c.late = op, shm.CQE{}, nil, false, nil
	return c
}

// putCall recycles a call whose completion has been consumed.
func putCall(c *call) { callPool.Put(c) }

// conn is one connection generation of a Session: socket, mappings, ring
// and the two goroutines serving them.
type conn struct {
	s       *Session
	sock    *net.UnixConn
	welcome shm.Welcome
	arena   *shm.Region
	ringReg *shm.Region
	ring    *shm.Ring
	mem     []byte // arena mapping
	// The daemon's arena on this client's GPU (nil without one), and
	// whether mem is registered as pinned with the device.
	gpu        cudaipc.Mapping
	gpuSize    uint64
	hostPinned bool
	spin       time.Duration
	pacer      shm.Pacer // await's yield pacing, shared by the callers

	sqMu sync.Mutex
	// unrung (under sqMu) says entries were pushed without the doorbell
	// (lazy releases); bellArmed says the bell timer is due to ring it.
	unrung    bool
	bellArmed atomic.Bool
	bell      *time.Timer // rings for lazy entries; runs ringLazy
	// overflow (sqMu) holds lazy entries (releases) that found the
	// submission ring full: a release does not wait for the daemon. They
	// keep their place: push sends them before any later entry, and
	// drainOverflow (running while overflowing) once the ring has room.
	overflow    []shm.SQE
	overflowing bool

	// pollMu makes the completion ring single-consumer: whoever holds it
	// (a waiting caller or the reaper) pops and dispatches. cqBuf is its
	// scratch space.
	pollMu sync.Mutex
	cqBuf  [64]shm.CQE
	// sleepers counts callers that stopped spinning and block on their
	// channel; only then does the reaper poll (and the daemon ring its
	// doorbell), so the fast path needs no thread hand-off.
	sleepers atomic.Int32
	kick     chan struct{}
	// orphans counts fire-and-forget entries in flight (releases, undo
	// entries): no caller waits for their completions. Left in the
	// completion ring they would fill it, and the daemon stops taking
	// submissions (those releases and undos included) while it is full, so
	// the reaper drains them once there are more than orphanLimit; below
	// that, callers polling for their own completions drain them for free
	// (waking the reaper per release costs a thread wake-up and makes the
	// daemon ring the futex on every completion).
	orphans     atomic.Int64
	orphanLimit int64
	// abandoned counts calls whose callers gave up (context): their late
	// hooks free data-area pages other calls may wait for, so the reaper
	// drains them at once.
	abandoned atomic.Int64

	pmu     sync.Mutex
	pending map[uint64]*call
	nextUD  uint64
	dead    bool
	deadErr error

	data dataArea

	deadCh     chan struct{}
	reaperDone chan struct{}
	readerDone chan struct{}
	// refs counts the live users of the mappings: 1 for the connection
	// itself plus one per open reservation or lease.
	refs atomic.Int64
}

func (s *Session) dial(ctx context.Context) (*conn, error) {
	h := shm.Hello{PID: uint32(os.Getpid()), Namespace: s.ns, Name: s.c.opts.Name}
	if s.c.dev != nil {
		h.GPUUUID = s.c.dev.Info().UUID
	}
	uc, w, fds, err := s.c.handshake(ctx, h, shm.WelcomeFDs)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*conn, error) {
		uc.Close()
		return nil, err
	}
	if w.BlockBytes != s.ns.BlockBytes {
		closeFD(fds[0])
		closeFD(fds[1])
		return fail(fmt.Errorf("%w: daemon announced block size %d, namespace has %d", shm.ErrMalformed, w.BlockBytes, s.ns.BlockBytes))
	}
	if err := w.Ring.Validate(); err != nil || int64(w.RingSize) != w.Ring.Size() {
		closeFD(fds[0])
		closeFD(fds[1])
		return fail(fmt.Errorf("%w: bad ring geometry (%v)", shm.ErrMalformed, err))
	}
	arena, err := shm.MapRegion(fds[0], int64(w.ArenaSize), !s.c.opts.NoPopulate)
	if err != nil {
		closeFD(fds[1])
		return fail(fmt.Errorf("map host arena: %w", err))
	}
	ringReg, err := shm.MapRegion(fds[1], int64(w.RingSize), true)
	if err != nil {
		arena.Close()
		return fail(fmt.Errorf("map ring: %w", err))
	}
	ring, err := shm.NewRing(ringReg.Bytes(), w.Ring, false)
	if err != nil {
		arena.Close()
		ringReg.Close()
		return fail(err)
	}
	cn := &conn{
		s: s, sock: uc, welcome: w, arena: arena, ringReg: ringReg, ring: ring, mem: arena.Bytes(),
		spin: s.c.opts.Spin, pending: map[uint64]*call{}, orphanLimit: int64(w.Ring.Entries / 4),
		kick:   make(chan struct{}, 1),
		deadCh: make(chan struct{}), reaperDone: make(chan struct{}), readerDone: make(chan struct{}),
	}
	if w.Flags&shm.WelcomeFlagGPU != 0 {
		if err := cn.openGPU(ctx); err != nil {
			arena.Close()
			ringReg.Close()
			return fail(err)
		}
	}
	cn.data.init(len(ring.Data()))
	cn.bell = time.AfterFunc(time.Hour, cn.ringLazy)
	cn.bell.Stop()
	cn.refs.Store(1)
	go cn.reaper()
	go cn.reader()
	return cn, nil
}

// kill ends the connection: pending calls fail with err, goroutines exit.
func (cn *conn) kill(err error) {
	cn.pmu.Lock()
	if cn.dead {
		cn.pmu.Unlock()
		return
	}
	cn.dead, cn.deadErr = true, err
	pend := cn.pending
	cn.pending = map[uint64]*call{}
	cn.pmu.Unlock()
	// The reaper drops the connection's own reference (and may unmap the
	// ring) as soon as deadCh is closed and the reader is gone: keep the
	// mappings alive until ClientInterrupt is done. The connection's own
	// reference is still held here, so refs > 0.
	cn.ref()
	defer cn.unref()
	close(cn.deadCh)
	for _, c := range pend {
		if c.abandoned {
			if c.late != nil {
				c.late()
			}
			continue
		}
		c.err = err
		c.done <- struct{}{}
	}
	cn.sock.Close()
	cn.ring.ClientInterrupt()
	cn.data.wake()
}

// errDead is the error that killed the connection.
func (cn *conn) errDead() error {
	cn.pmu.Lock()
	defer cn.pmu.Unlock()
	return cn.deadErr
}

func (cn *conn) isDead() bool {
	select {
	case <-cn.deadCh:
		return true
	default:
		return false
	}
}

// wait blocks until both goroutines have exited.
func (cn *conn) wait() {
	<-cn.reaperDone
	<-cn.readerDone
}

func (cn *conn) ref() { cn.refs.Add(1) }

// tryRef takes a reference on the mappings unless they are already unmapped
// (the connection died and every user let go). Whoever touches the ring or
// the arena without holding a reservation or lease must hold one.
func (cn *conn) tryRef() bool {
	for {
		n := cn.refs.Load()
		if n <= 0 {
			return false
		}
		if cn.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// unref drops a mapping user; the last one unmaps.
func (cn *conn) unref() {
	if cn.refs.Add(-1) == 0 {
		cn.bell.Stop()
		cn.closeGPU()
		cn.arena.Close()
		cn.ringReg.Close()
	}
}

// reader watches the socket: the daemon never sends on a session socket
// after the Welcome, so anything but silence means the session is over.
func (cn *conn) reader() {
	defer close(cn.readerDone)
	buf := make([]byte, 4096)
	_, fds, err := shm.RecvMsg(cn.sock, buf, 0)
	for _, fd := range fds {
		closeFD(fd)
	}
	if err == nil {
		err = errors.New("unexpected message from daemon")
	}
	cn.kill(fmt.Errorf("%w: %v", ErrDisconnected, err))
}

// testReaperExit, set only by tests, runs as a reaper exits, before it
// drops the connection's reference.
var testReaperExit func()

// reaper serves callers that gave up spinning: it sleeps on the
// completion doorbell and dispatches. It exits when the connection dies and
// releases the connection's own reference on the mappings.
func (cn *conn) reaper() {
	defer func() {
		<-cn.readerDone
		if testReaperExit != nil {
			testReaperExit()
		}
		// Unmapped (unless a reservation or lease still holds the
		// mappings) before wait, hence Session.Close, returns.
		cn.unref()
		close(cn.reaperDone)
	}()
	for {
		if cn.sleepers.Load() == 0 && cn.abandoned.Load() <= 0 && cn.orphans.Load() <= cn.orphanLimit {
			select {
			case <-cn.kick:
			case <-cn.deadCh:
				return
			}
			continue
		}
		if cn.poll() {
			continue
		}
		if cn.isDead() {
			return
		}
		// kill interrupts after closing deadCh: checking it in the wait
		// means the reaper never sleeps through its connection's death.
		cn.ring.ClientWait(0, 10*time.Millisecond, cn.isDead)
	}
}

// poll drains the completion ring unless another goroutine is doing so. It
// reports whether it dispatched anything.
func (cn *conn) poll() bool {
	if !cn.pollMu.TryLock() {
		return false
	}
	n := cn.ring.ClientPop(cn.cqBuf[:])
	if n > 0 {
		cn.complete(cn.cqBuf[:n])
	}
	cn.pollMu.Unlock()
	return n > 0
}

// waiting counts this process's calls in await, over every connection.
var waiting atomic.Int32

// crowdFactor multiplies the spin budget of a call that waits while other
// calls of the process wait too (see spinBudget).
const crowdFactor = 20

// spinBudget is the polling budget of a call that finds others of its
// process waiting (crowded) or not. A lone waiter polls for Spin and then
// sleeps, leaving the CPU to the daemon. When several wait at once, the
// process has other callers to yield to (each yield lets one copy its
// block), and a call that sleeps costs the daemon a futex wake-up and the
// client a thread hand-off on its answer, so it polls for 20 × Spin.
// Measured with 2 MiB Put/Get, 4 sessions on 2 CPUs: 21.6 → 22.8 GB/s
// median (8 interleaved pairs); 4-session lookups 155–285 k → 253–408 k
// ops/s; 1 session unchanged (docs/benchmarks.md, "Crowded callers spin
// longer").
func spinBudget(spin time.Duration, crowded bool) time.Duration {
	if crowded {
		return crowdFactor * spin
	}
	return spin
}

// await waits for one call: it polls the completion ring itself for the
// spin budget (no hand-off to another thread, whose wake-up costs tens of
// microseconds on virtual machines), then sleeps with the reaper's help.
// The spinner yields to the session's other callers and to the daemon, and
// counts only its own polling against the budget (see shm.Spinner).
func (cn *conn) await(ctx context.Context, c *call) error {
	crowded := waiting.Add(1) > 1
	defer waiting.Add(-1)
	var sp shm.Spinner
	sp.Reset(spinBudget(cn.spin, crowded), &cn.pacer)
	for i := 0; ; i++ {
		select {
		case <-c.done:
			return nil
		default:
		}
		if cn.poll() {
			continue
		}
		if i&31 == 31 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if !sp.Pause() {
			break
		}
	}
	cn.sleepers.Add(1)
	defer cn.sleepers.Add(-1)
	cn.kickReaper()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (cn *conn) complete(cqes []shm.CQE) {
	var undo []shm.SQE
	cn.pmu.Lock()
	for i := range cqes {
		ud := cqes[i].UserData
		if ud == 0 {
			cn.orphans.Add(-1) // fire-and-forget (release, undo)
			continue
		}
		c, ok := cn.pending[ud]
		if !ok {
			continue
		}
		delete(cn.pending, ud)
		if c.abandoned {
			cn.abandoned.Add(-1)
			// The caller left (context); undo what the daemon granted so
			// nothing stays pinned until the session ends.
			if u, ok := undoOf(c.op, &cqes[i]); ok {
				undo = append(undo, u)
			}
			if c.late != nil {
				c.late()
			}
			putCall(c)
			continue
		}
		c.cqe = cqes[i]
		c.done <- struct{}{}
	}
	cn.pmu.Unlock()
	// Not inline: the caller holds pollMu, and a push that finds the
	// submission ring full needs the completion ring drained.
	cn.pushAsync(undo)
}

// undoOf returns the entry that gives back what a completed entry granted
// (a reservation or a lease), if anything.
func undoOf(op shm.Op, c *shm.CQE) (shm.SQE, bool) {
	if c.Status != shm.StatusOK {
		return shm.SQE{}, false
	}
	switch op {
	case shm.OpReserve:
		return shm.SQE{Op: shm.OpAbort, Token: c.Value}, true
	case shm.OpAcquire:
		return shm.SQE{Op: shm.OpRelease, Token: c.Value}, true
	}
	return shm.SQE{}, false
}

// pushAsync submits undo entries from a goroutine of its own, holding the
// mappings. A dead connection needs no undo: the daemon freed everything.
func (cn *conn) pushAsync(es []shm.SQE) {
	if len(es) == 0 || !cn.tryRef() {
		return
	}
	cn.addOrphans(len(es))
	go func() {
		defer cn.unref()
		cn.push(context.Background(), es)
	}()
}

// addOrphans accounts for n fire-and-forget entries and wakes the reaper
// when their completions must be drained.
func (cn *conn) addOrphans(n int) {
	if cn.orphans.Add(int64(n)) > cn.orphanLimit {
		cn.kickReaper()
	}
}

func (cn *conn) kickReaper() {
	select {
	case cn.kick <- struct{}{}:
	default:
	}
}

// lazyBell bounds how long a lazily pushed entry (a lease release) may
// wait in the submission ring for a doorbell: the session's next call rings
// it at once, the bell timer after this long.
const lazyBell = 200 * time.Microsecond

// pushLazy appends entries without ringing the doorbell. A release needs no
// answer, and waking a sleeping ring loop for it costs a futex wake-up and
// two context switches (a third of the client's wake-ups in a 4-session
// Put/Get run; docs/benchmarks.md, "Lazy release doorbell"); the session's
// next call, which follows at once in a busy engine, rings for both, and a
// timer rings within lazyBell otherwise.
//
// A loop that is still polling needs no doorbell at all, so then neither is
// the timer armed: re-arming it costs the runtime a timer update, and at
// times the wake-up of an idle thread, which then takes the CPU from that
// polling loop (release 2.8 µs on average, p90 12.5 µs, one session
// putting and getting 2 MiB blocks; 0.6 µs when the release rang at once).
func (cn *conn) pushLazy(es []shm.SQE) error {
	cn.sqMu.Lock()
	n := 0
	if len(cn.overflow) == 0 {
		n = cn.ring.ClientPush(es)
	}
	if n > 0 && cn.ring.ClientNeedsWake() {
		cn.unrung = true
	}
	if n == len(es) {
		// Armed under sqMu, so that push's disarm cannot stop this timer.
		if cn.unrung && cn.bellArmed.CompareAndSwap(false, true) {
			cn.bell.Reset(lazyBell)
		}
		cn.sqMu.Unlock()
		return nil
	}
	defer cn.sqMu.Unlock()
	if cn.isDead() {
		return cn.errDead()
	}
	// The ring is full (the daemon stalls): queue the rest and return.
	cn.unrung = false
	cn.ring.ClientWake()
	cn.overflow = append(cn.overflow, es[n:]...)
	if !cn.overflowing && cn.tryRef() {
		cn.overflowing = true
		go cn.drainOverflow()
	}
	return nil
}

// pushOverflowLocked pushes queued lazy entries and reports whether none
// is left. sqMu held.
func (cn *conn) pushOverflowLocked() bool {
	if len(cn.overflow) == 0 {
		return true
	}
	if k := cn.ring.ClientPush(cn.overflow); k > 0 {
		cn.overflow = cn.overflow[k:]
		cn.unrung = false
		cn.ring.ClientWake()
	}
	if len(cn.overflow) == 0 {
		cn.overflow = nil
		return true
	}
	return false
}

// drainOverflow pushes the overflow as the ring makes room, until it is
// empty or the connection dies (then the daemon frees everything). It holds
// a reference on the mappings, taken by its starter.
func (cn *conn) drainOverflow() {
	defer cn.unref()
	wait := pushMinWait
	for {
		cn.sqMu.Lock()
		if cn.pushOverflowLocked() || cn.isDead() {
			cn.overflow, cn.overflowing = nil, false
			cn.sqMu.Unlock()
			return
		}
		cn.sqMu.Unlock()
		// The daemon stops taking submissions while the completion ring
		// is full: drain it.
		cn.poll()
		time.Sleep(wait)
		wait = min(2*wait, pushMaxWait)
	}
}

// ringLazy (the bell timer) rings the doorbell for lazily pushed entries
// not rung since.
func (cn *conn) ringLazy() {
	if !cn.tryRef() { // the rings may be unmapped already
		return
	}
	defer cn.unref()
	// Disarm first: a lazy push after this re-arms, one before is rung here.
	cn.bellArmed.Store(false)
	cn.sqMu.Lock()
	if cn.unrung {
		cn.unrung = false
		cn.ring.ClientWake()
	}
	cn.sqMu.Unlock()
}

// push appends entries to the submission ring and rings the doorbell,
// waiting (bounded by connection death and ctx) while the ring is full. It
// returns how many entries it pushed. sqMu is not held while waiting, so a
// stalled daemon cannot block other callers past their own contexts.
//
// A full ring is polled for the spin budget, then waited on with sleeps
// growing to pushMaxWait: the ring has no doorbell for room, and a daemon
// stalled for seconds (SIGSTOP, a blocked disk) must not cost the engine a
// CPU per waiting push (background undo pushes wait without a deadline).
func (cn *conn) push(ctx context.Context, es []shm.SQE) (int, error) {
	pushed := 0
	var sp shm.Spinner
	var timer *time.Timer
	wait, spinning := time.Duration(0), false
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for pushed < len(es) {
		cn.sqMu.Lock()
		n := 0
		if cn.pushOverflowLocked() { // queued releases go first
			n = cn.ring.ClientPush(es[pushed:])
		}
		pushed += n
		if n > 0 {
			cn.unrung = false
			cn.ring.ClientWake()
			if cn.bellArmed.CompareAndSwap(true, false) {
				cn.bell.Stop() // a late ringLazy finds nothing unrung
			}
		}
		cn.sqMu.Unlock()
		if n > 0 {
			continue
		}
		if cn.isDead() {
			return pushed, cn.deadErr
		}
		if err := ctx.Err(); err != nil {
			return pushed, err
		}
		// The daemon stops taking submissions while the completion ring
		// is full (fire-and-forget releases accumulate there): drain it.
		if cn.poll() {
			continue
		}
		if !spinning {
			spinning = true
			sp.Reset(cn.spin, &cn.pacer)
		}
		if sp.Pause() {
			continue
		}
		wait = min(max(2*wait, pushMinWait), pushMaxWait)
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
		case <-cn.deadCh:
		}
	}
	return pushed, nil
}

// pushMinWait and pushMaxWait bound the sleeps of a push waiting for room
// in the submission ring after its spin.
const (
	pushMinWait = 10 * time.Microsecond
	pushMaxWait = time.Millisecond
)

// submit sends entries and waits for all their completions. On ctx
// cancellation it returns ctx.Err() and everything the entries were granted
// is given back: at once for completions already in, on arrival for the rest.
func (cn *conn) submit(ctx context.Context, es []shm.SQE, out []shm.CQE) error {
	_, err := cn.submitLate(ctx, es, out, nil)
	return err
}

// submitLate is submit for entries that refer to the data area. When the
// caller abandons them (ctx), the daemon may still read and write that area:
// late, which frees it, then runs once the daemon answered every abandoned
// entry (or the connection died), and handedOff is true. Otherwise late never
// runs and the caller frees.
func (cn *conn) submitLate(ctx context.Context, es []shm.SQE, out []shm.CQE, late func()) (handedOff bool, err error) {
	// Callers poll and push on the shared ring: keep it mapped meanwhile.
	if !cn.tryRef() {
		return false, cn.errDead()
	}
	defer cn.unref()
	calls := make([]*call, len(es))
	cn.pmu.Lock()
	if cn.dead {
		err := cn.deadErr
		cn.pmu.Unlock()
		return false, err
	}
	for i := range es {
		c := getCall(es[i].Op)
		cn.nextUD++
		es[i].UserData = cn.nextUD
		cn.pending[cn.nextUD] = c
		calls[i] = c
	}
	cn.pmu.Unlock()
	// A context that has already ended sends nothing: pushed, a Delete
	// would delete (and a Commit commit) while the call reports the
	// context's error.
	n, err := 0, ctx.Err()
	if err == nil {
		n, err = cn.push(ctx, es)
	}
	if err != nil {
		// Entries not pushed never reach the daemon: forget them. Those
		// pushed are abandoned like calls whose caller gave up waiting.
		// A commit or abort among them would leave its reservation held
		// in the daemon (the caller's Reservation is finished): abort it
		// once the ring has room.
		var undo []shm.SQE
		cn.pmu.Lock()
		for i := n; i < len(es); i++ {
			delete(cn.pending, es[i].UserData)
			if es[i].Op == shm.OpCommit || es[i].Op == shm.OpAbort {
				undo = append(undo, shm.SQE{Op: shm.OpAbort, Token: es[i].Token})
			}
		}
		cn.pmu.Unlock()
		if len(undo) > 0 {
			// Queued like releases, ahead of the session's next entries:
			// its next Put of the block must not find it still reserved
			// ("exists": taken for stored).
			cn.addOrphans(len(undo))
			cn.pushLazy(undo)
		}
		return cn.abandon(es[:n], calls[:n], late), err
	}
	var firstErr error
	for i, c := range calls {
		if err := cn.await(ctx, c); err != nil {
			// Completions consumed so far are discarded with the call:
			// give back what they granted too.
			var undo []shm.SQE
			for j := 0; j < i; j++ {
				if u, ok := undoOf(es[j].Op, &out[j]); ok && calls[j] == nil {
					undo = append(undo, u)
				}
			}
			cn.pushAsync(undo)
			return cn.abandon(es[i:], calls[i:], late), err
		}
		if c.err != nil && firstErr == nil {
			firstErr = c.err
		}
		out[i] = c.cqe
		if c.err == nil {
			calls[i] = nil // consumed and OK: see the undo above
		}
		putCall(c)
	}
	return false, firstErr
}

// abandon marks calls whose completions the caller will not wait for. It
// reports whether late was handed to pending calls (it runs after the last
// of them completes); otherwise late is not run.
func (cn *conn) abandon(es []shm.SQE, calls []*call, late func()) bool {
	cn.pmu.Lock()
	defer cn.pmu.Unlock()
	var undo []shm.SQE
	var waiting []*call
	for i, c := range calls {
		if _, ok := cn.pending[es[i].UserData]; ok {
			c.abandoned = true
			waiting = append(waiting, c)
			continue
		}
		// Already completed (or failed) but not consumed: undo now.
		<-c.done
		if c.err == nil {
			if u, ok := undoOf(c.op, &c.cqe); ok {
				undo = append(undo, u)
			}
		}
	}
	cn.pushAsync(undo)
	if len(waiting) > 0 {
		cn.abandoned.Add(int64(len(waiting)))
		cn.kickReaper()
	}
	if late == nil || len(waiting) == 0 {
		return false
	}
	left := int32(len(waiting))
	for _, c := range waiting {
		c.late = func() { // serialized by pmu (complete; kill after removing them)
			if left--; left == 0 {
				late()
			}
		}
	}
	return true
}

// slot returns the arena bytes of a completion's slot after checking that
// the daemon's offset lies inside the mapping.
func (cn *conn) slot(c *shm.CQE) ([]byte, error) {
	size := cn.welcome.BlockBytes
	if err := shm.CheckSlot(c.Offset, size, uint64(len(cn.mem))); err != nil {
		return nil, fmt.Errorf("host slot: %w", err)
	}
	return cn.mem[c.Offset : c.Offset+size : c.Offset+size], nil
}

// place resolves a reserve or acquire completion's slot: a GPU slot (device
// entries only) to its address in the daemon's GPU arena, anything else to
// the host arena's bytes. Either is checked against the mapping.
func (cn *conn) place(c *shm.CQE, flags uint8, buf *[]byte, dptr *cudaipc.DevicePtr) error {
	if c.Tier == shm.TierGPU {
		if flags&shm.SQEFlagDevice == 0 {
			return fmt.Errorf("%w: daemon returned a GPU slot for a host entry", shm.ErrMalformed)
		}
		p, err := cn.devSlot(c)
		*dptr = p
		return err
	}
	b, err := cn.slot(c)
	*buf = b
	return err
}

// dataArea hands out page runs of the ring's data area for lookup batches.
type dataArea struct {
	mu    sync.Mutex
	cond  *sync.Cond
	used  []bool
	dead  bool
	pages int
}

const dataPage = 4096

func (d *dataArea) init(size int) {
	d.cond = sync.NewCond(&d.mu)
	d.pages = size / dataPage
	d.used = make([]bool, d.pages)
}

// maxBytes is the largest single allocation.
func (d *dataArea) maxBytes() int { return d.pages * dataPage }

// errAreaDead: the connection died while alloc waited.
var errAreaDead = errors.New("data area of a dead connection")

// alloc returns the offset of a run of pages covering n bytes, waiting for
// space. It fails with errAreaDead if the connection died meanwhile, or with
// ctx's error.
func (d *dataArea) alloc(ctx context.Context, n int) (off int, err error) {
	want := (n + dataPage - 1) / dataPage
	stop := context.AfterFunc(ctx, func() {
		d.mu.Lock()
		d.mu.Unlock()
		d.cond.Broadcast()
	})
	defer stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		if d.dead {
			return 0, errAreaDead
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		run := 0
		for i := 0; i < d.pages; i++ {
			if d.used[i] {
				run = 0
				continue
			}
			run++
			if run == want {
				start := i - want + 1
				for j := start; j <= i; j++ {
					d.used[j] = true
				}
				return start * dataPage, nil
			}
		}
		d.cond.Wait()
	}
}

func (d *dataArea) free(off, n int) {
	want := (n + dataPage - 1) / dataPage
	d.mu.Lock()
	for j := off / dataPage; j < off/dataPage+want; j++ {
		d.used[j] = false
	}
	d.mu.Unlock()
	d.cond.Broadcast()
}

func (d *dataArea) wake() {
	d.mu.Lock()
	d.dead = true
	d.mu.Unlock()
	d.cond.Broadcast()
}
