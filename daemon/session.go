package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/policy"
)

// sleepBound caps each futex sleep of the ring loop so a stop request or a
// lost doorbell (the peer is untrusted) is noticed promptly. Tests raise it
// (Daemon.sleepBound) so that a wake-up lost by the daemon itself shows as
// a hang rather than a delay.
const sleepBound = 50 * time.Millisecond

// errStopped ends a ring loop that was asked to stop.
var errStopped = errors.New("session stopped")

type session struct {
	d     *Daemon
	id    uint64
	conn  *net.UnixConn
	log   *slog.Logger
	nsID  uint32
	block int64
	// pid is the client's tgid (SO_PEERCRED), which the eBPF exit tracer
	// watches while watched (set and read on the session's goroutine).
	pid     uint32
	watched bool
	// gpu is the index of the client's GPU in d.gpus (-1: none).
	gpu int

	region *shm.Region
	ring   *shm.Ring
	data   []byte // the ring region's data area (peer-writable)
	spin   time.Duration
	pacer  shm.Pacer // the ring loop's yield pacing, kept across waits
	// granted: the last entry taken was a reservation or a lease.
	granted bool

	stopOnce sync.Once
	stopCh   chan struct{}
	// ringMu guards unmapped: a promotion's completion (a mover goroutine)
	// may land after the session gave up waiting for it and unmapped the
	// ring region, whose doorbell it would write.
	ringMu   sync.RWMutex
	unmapped bool
	// badControl: why readControl closed the session for a malformed control
	// message (counted as hostile, like a ring protocol violation).
	badControl atomic.Pointer[error]

	// Owned by the ring loop goroutine alone.
	nextToken uint64
	res       map[uint64]*tiers.Handle
	leases    map[uint64]*tiers.Handle
	keys      []tiers.Key
	tiersOut  []shm.Tier
	// deferred carries completions of acquires that needed a promotion
	// from NVMe; outstanding counts them (loop-owned). Its capacity is the
	// ring size, and outstanding never exceeds the completion ring's free
	// space, so a mover's send never blocks.
	deferred    chan deferredCQE
	outstanding int
	// pending maps the blocks the last lookup missed to their place in its
	// chain, for the replacement policy when they are put.
	pending map[tiers.Key]policy.AccessInfo
	// maxTokens bounds the reservations and leases the session holds (with
	// the acquires still outstanding): leases on one block are not limited
	// by any tier's capacity, so without it every acquire of the same block
	// would grow s.leases for good.
	maxTokens int
}

// threadReserve is how many threads the daemon keeps in reserve beyond its
// sessions' (runtime threads for its Ps, which procSizer raises up to
// procs.max, and system calls of the movers and the NVMe tier): a session
// is refused when fewer are left.
func (d *Daemon) threadReserve() int { return 64 + d.procs.max }

// maxPendingInfo bounds the per-session memory of a lookup's misses.
const maxPendingInfo = 4096

// maxHeldTokens caps maxTokens whatever the tiers' sizes.
const maxHeldTokens = 1 << 20

// tokenLimit is how many reservations and leases a session of blockBytes
// blocks may hold: one per block the tiers can hold, plus a ring's worth.
func (d *Daemon) tokenLimit(blockBytes int64, entries int) int {
	n := d.arena.Size() / blockBytes
	if d.gpus != nil {
		for _, g := range d.gpus.GPUs {
			n += g.Arena.Size() / blockBytes
		}
	}
	return int(min(n+int64(entries), maxHeldTokens))
}

// deferredCQE is a completion produced off the ring loop.
type deferredCQE struct {
	userData uint64
	hd       *tiers.Handle
	err      error
	parked   bool // the block of a parked request
}

// deferredWait bounds how long a closing session waits for promotions it
// started (disk reads) before giving up on their leases.
const deferredWait = 10 * time.Second

// newSession registers the namespace, creates the session's ring region and
// sends the Welcome with the arena and ring fds. On failure it refuses the
// peer with a reason and returns an error.
func (d *Daemon) newSession(c *net.UnixConn, cred *unix.Ucred, h shm.Hello, log *slog.Logger) (*session, error) {
	// Everything that can refuse the peer comes before Register, which
	// spends a namespace id for good (and rewrites the registry file).
	if int64(h.Namespace.BlockBytes) > int64(d.cfg.Host.SlabBytes) {
		err := fmt.Errorf("block_bytes %d exceeds the host tier's slab size %d", h.Namespace.BlockBytes, d.cfg.Host.SlabBytes)
		d.refuse(c, shm.CodeNamespace, err.Error())
		return nil, err
	}
	layout := shm.RingLayout{Entries: uint32(d.cfg.Session.RingEntries), DataSize: uint32(d.cfg.Session.DataBytes)}
	threads, threadsWhat, threadsKnown := threadLimit()
	d.mu.Lock()
	// Sessions being opened count against the limit too, or concurrent
	// (or back-to-back) handshakes could all pass the check; so do those
	// ended with reservations held in the quarantine (their slots).
	if quar := int(d.quar.held.Load()); len(d.sessions)+d.opening+quar >= d.cfg.Session.MaxSessions {
		d.mu.Unlock()
		err := fmt.Errorf("session limit %d reached (%d of them ended, their reservations held in quarantine)", d.cfg.Session.MaxSessions, quar)
		d.refuse(c, shm.CodeBusy, err.Error())
		return nil, err
	}
	// A session's ring loop holds a thread while it sleeps (a futex
	// wait), and a thread the runtime cannot create ends the process:
	// every session would go with it.
	if reserve := d.threadReserve(); threadsKnown && len(d.sessions)+d.opening >= threads-reserve {
		sessions := len(d.sessions)
		d.mu.Unlock()
		err := fmt.Errorf("out of threads: %d sessions open, %s allows %d threads, %d kept in reserve", sessions, threadsWhat, threads, reserve)
		log.Warn("session refused: out of threads", "err", err)
		d.refuse(c, shm.CodeBusy, "kvtierd is "+err.Error()+"; try again later")
		return nil, err
	}
	d.opening++
	d.nextID++
	id := d.nextID
	d.mu.Unlock()
	opened := false
	defer func() {
		if !opened {
			d.mu.Lock()
			d.opening--
			d.mu.Unlock()
		}
	}()
	nsID, err := d.reg.Register(h.Namespace)
	if err != nil {
		log.Warn("namespace refused", "err", err)
		d.refuse(c, shm.CodeNamespace, err.Error())
		return nil, err
	}

	region, err := shm.CreateRegion(fmt.Sprintf("kvtier-session-%d", id), layout.Size(), false)
	if err != nil {
		err = fmt.Errorf("session %d: %w", id, err)
		if acceptRetryable(err) {
			// Out of fds (or memory) for now: the peer may try again
			// once sessions close; the operator needs the reason.
			reason := "out of memory"
			if outOfFDs(err) {
				reason = "out of file descriptors"
			}
			log.Warn("session refused: "+reason, "err", err, "fd_limit", fdLimit())
			d.refuse(c, shm.CodeBusy, fmt.Sprintf("kvtierd is %s: %v (its file descriptor limit is %d); try again later", reason, errors.Unwrap(err), fdLimit()))
			return nil, err
		}
		log.Warn("session refused: cannot create its ring region", "err", err)
		d.refuse(c, shm.CodeInternal, "cannot create ring region")
		return nil, err
	}
	ring, err := shm.NewRing(region.Bytes(), layout, true)
	if err != nil {
		region.Close()
		d.refuse(c, shm.CodeInternal, "cannot create ring")
		return nil, err
	}
	s := &session{
		d: d, id: id, conn: c, nsID: nsID, block: int64(h.Namespace.BlockBytes), pid: uint32(cred.Pid),
		log:    log.With("session", id, "namespace", nsID, "client", h.Name),
		region: region, ring: ring, data: ring.Data(),
		spin:   time.Duration(d.cfg.Session.SpinMicros) * time.Microsecond,
		pacer:  shm.Pacer{Yielding: true, Share: d.crowded}, // spin only while the CPU is otherwise idle
		stopCh: make(chan struct{}), res: map[uint64]*tiers.Handle{}, leases: map[uint64]*tiers.Handle{},
		deferred:  make(chan deferredCQE, layout.Entries),
		pending:   map[tiers.Key]policy.AccessInfo{},
		maxTokens: d.tokenLimit(int64(h.Namespace.BlockBytes), int(layout.Entries)),
	}
	w := shm.Welcome{
		SessionID: id, NamespaceID: nsID, BlockBytes: h.Namespace.BlockBytes,
		ArenaSize: uint64(d.arena.Size()), RingSize: uint64(region.Size()), Ring: layout,
	}
	var ga *shm.GPUArena
	s.gpu, ga = d.gpuArenaFor(h.GPUUUID)
	if ga != nil {
		w.Flags |= shm.WelcomeFlagGPU
	}
	c.SetWriteDeadline(time.Now().Add(handshakeTimeout)) // from now: our setup above is not the peer's time
	if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgWelcome, shm.ProtocolVersion, w.Encode()), d.arena.Fd(), region.Fd()); err != nil {
		region.Close()
		return nil, fmt.Errorf("send welcome: %w", err)
	}
	if ga != nil {
		// The arena of the client's GPU (exported once, at start).
		if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgGPUArena, shm.ProtocolVersion, ga.Encode())); err != nil {
			region.Close()
			return nil, fmt.Errorf("send gpu arena: %w", err)
		}
	}
	d.mu.Lock()
	d.opening--
	opened = true
	d.sessions[id] = s
	d.procs.resize(len(d.sessions))
	// Run sets closing before it stops the sessions in the map (under
	// d.mu): a session added after that must stop itself, or Run would
	// wait for it forever.
	if d.closing.Load() {
		s.stop()
	}
	d.mu.Unlock()
	d.watchClient(s) // its death stops it without waiting for EOF (ebpf.go)
	d.sessionsTotal.Add(1)
	s.log.Info("session opened", "model", h.Namespace.ModelID, "block_bytes", h.Namespace.BlockBytes)
	if d.nvme != nil && int64(h.Namespace.BlockBytes) > d.nvme.MaxBlockBytes() {
		s.log.Warn("blocks of this namespace are larger than the NVMe tier's largest block: they are dropped from the host tier instead of demoted (raise nvme.capacity)",
			"block_bytes", h.Namespace.BlockBytes, "nvme_max_block", d.nvme.MaxBlockBytes())
	}
	return s, nil
}

func (s *session) stop() {
	s.stopOnce.Do(func() { close(s.stopCh) })
	s.interrupt()
}

// interrupt wakes the ring loop, unless the ring region is unmapped.
func (s *session) interrupt() {
	s.ringMu.RLock()
	if !s.unmapped {
		s.ring.DaemonInterrupt()
	}
	s.ringMu.RUnlock()
}

func (s *session) stopped() bool {
	select {
	case <-s.stopCh:
		return true
	default:
		return false
	}
}

// crowded reports whether the ring loops may leave other goroutines without
// a P: with fewer loops than GOMAXPROCS one P is always left for the rest of
// the daemon (and a loop woken from its futex finds it idle), so a spinning
// loop needs not yield to the Go scheduler (shm.Pacer.Share).
func (d *Daemon) crowded() bool {
	return int(d.loops.Load()) >= runtime.GOMAXPROCS(0)
}

// spinLimit is how many ring loops may spin at once (see loop): one per
// CPU for a hot session or while there are no more loops than CPUs, half
// the CPUs otherwise.
func (d *Daemon) spinLimit(hot bool) int32 {
	if hot || d.loops.Load() <= d.maxHot {
		return d.maxHot
	}
	return d.maxSpinners
}

// run serves the session until the peer disconnects, breaks the protocol,
// or the daemon stops; then frees everything the session held.
func (s *session) run() {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.readControl()
	}()
	s.d.loops.Add(1)
	err := s.loop()
	s.d.loops.Add(-1)
	t0 := time.Now()
	s.teardown()
	if bad := s.badControl.Load(); errors.Is(err, errStopped) && bad != nil {
		err = *bad
	}
	switch {
	case errors.Is(err, errStopped):
		s.log.Info("session closed", "freed_in", time.Since(t0))
	default:
		s.d.sessionsBad.Add(1)
		s.log.Warn("closing session: peer broke the protocol", "reason", err)
	}
	s.conn.Close() // ends readControl; tells the client
	wg.Wait()
	// Leave the map before unmapping: Run's shutdown calls stop, which
	// writes the ring's doorbell, on every session in the map.
	s.d.mu.Lock()
	delete(s.d.sessions, s.id)
	s.d.procs.resize(len(s.d.sessions))
	s.d.mu.Unlock()
	s.d.unwatchClient(s)
	s.ringMu.Lock()
	s.unmapped = true
	s.ringMu.Unlock()
	s.region.Close()
}

// readControl handles out-of-band requests and notices the peer's death: a
// killed client's socket reads EOF, which stops the ring loop at once.
func (s *session) readControl() {
	defer s.stop()
	// A flush asked for here ends with the session (a shutdown stops it).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	// Stored before the deferred stop: run reads it after the loop ends.
	bad := func(err error) { s.badControl.Store(&err) }
	buf := make([]byte, 4096)
	for {
		raw, _, err := shm.RecvMsg(s.conn, buf, 0)
		if errors.Is(err, shm.ErrMalformed) || errors.Is(err, shm.ErrTooManyFDs) {
			// Passed fds, control data cut short (more fds than the
			// buffer holds) or a datagram larger than any request: a
			// peer breaking the protocol, not one hanging up. RecvMsg
			// closed whatever fds it was given.
			bad(fmt.Errorf("control message on the session socket: %w", err))
			return
		}
		if err != nil {
			return
		}
		if err := s.d.control(ctx, s.conn, raw, 0); err != nil {
			bad(fmt.Errorf("control message on the session socket: %w", err))
			return
		}
	}
}

// teardown quarantines open reservations (given back at once if the
// client's process is gone) and drops held leases, so a dead client's slots
// return to the arena immediately.
func (s *session) teardown() {
	deadline := time.After(s.d.deferredWait)
	for s.outstanding > 0 {
		select {
		case d := <-s.deferred:
			s.outstanding--
			if d.hd != nil {
				d.hd.Owner().Release(d.hd)
			}
		case <-deadline:
			// A stalled disk: give up waiting, but keep draining in the
			// background so late leases are released, not leaked.
			s.log.Error("promotions still pending at session close", "count", s.outstanding)
			go func(n int, ch <-chan deferredCQE) {
				for ; n > 0; n-- {
					if d := <-ch; d.hd != nil {
						d.hd.Owner().Release(d.hd)
					}
				}
			}(s.outstanding, s.deferred)
			s.outstanding = 0
		}
	}
	// Open reservations may still be written by their client: a device
	// session's by copies queued on its streams, any session's by a memcpy
	// through its mapping of the host arena, which the client library keeps
	// while a reservation is open, after the connection is gone. They wait
	// in the quarantine for its process to exit (quarantine.go).
	var held []*tiers.Handle
	for t, h := range s.res {
		held = append(held, h)
		delete(s.res, t)
	}
	s.d.quar.add(s.pid, held)
	for t, h := range s.leases {
		h.Owner().Release(h)
		delete(s.leases, t)
	}
}

// loop is the session's ring loop: pop what fits in the completion ring,
// dispatch, publish completions, sleep on the doorbell when idle.
func (s *session) loop() error {
	const batch = 64
	var sqes [batch]shm.SQE
	var cqes [batch]shm.CQE
	for {
		if s.stopped() {
			return errStopped
		}
		space, err := s.ring.DaemonCQSpace()
		if err != nil {
			return err
		}
		// Completions the movers finished go out first.
		if n := s.drainDeferred(cqes[:min(space, batch)]); n > 0 {
			s.ring.DaemonPush(cqes[:n])
			continue
		}
		// Keep room for the completions the movers still owe.
		free := space - s.outstanding
		if free <= 0 {
			// The client is not draining completions (or the room left
			// is owed to promotions under way): wait for it to consume
			// some, a promotion to finish or a stop, without polling on
			// its behalf (a stopped or hung client used to keep the loop
			// waking every 50 µs for as long as it stayed so). A finished
			// promotion ends the wait only if its completion fits.
			s.d.roomWaits.Add(1)
			more := s.stopped
			if space > 0 {
				more = s.woken
			}
			s.ring.DaemonWaitRoom(s.d.sleepBound, more)
			continue
		}
		n, err := s.ring.DaemonPop(sqes[:min(free, batch)])
		if err != nil {
			return err
		}
		if n == 0 {
			// Unless the client is busy with a block it was just given,
			// its next entry may be a poll away: catching it here saves
			// the client a doorbell and us a sleep, and teaches the pacer
			// whether the session is hot.
			if s.spin > 0 && !s.granted && s.ring.DaemonPollQuick(&s.pacer) {
				continue
			}
			// Spinning sessions are capped to half the CPUs so that many
			// idle-but-recent sessions cannot starve the clients; a hot
			// session (its client answers at once, see shm.Pacer.Hot) is
			// not idle, and each sleep would cost it a wake-up per round
			// trip, so hot ones may spin up to one per CPU (still
			// yielding to others). So may every loop while there are no
			// more loops than CPUs: then there are not many to starve
			// anyone, and a loop left asleep costs its client a futex
			// wake-up on every call that follows a copy (2 sessions on 2
			// vCPUs: 17–18 GB/s of Put/Get with the cap, 23–28 without;
			// docs/benchmarks.md, "Few sessions may all spin").
			// Only the spin counts against the limit: a loop asleep on
			// its doorbell costs no CPU and must not keep others from
			// spinning.
			if s.d.spinners.Add(1) <= s.d.spinLimit(!s.granted && s.pacer.Hot()) {
				woke := s.ring.DaemonSpin(s.spin, &s.pacer, s.woken)
				s.d.spinners.Add(-1)
				if woke {
					continue
				}
			} else {
				s.d.spinners.Add(-1)
			}
			// A promotion finishing or a stop meanwhile ends the wait
			// (see woken; checked only at the top of the loop, one that
			// came during the spin used to be slept through until
			// sleepBound).
			s.ring.DaemonWaitPaced(0, &s.pacer, s.d.sleepBound, s.woken)
			continue
		}
		m := 0
		// A reservation or lease is followed by the client's copy of the
		// block: no quick answer is coming (see the wait above).
		s.granted = sqes[n-1].Op == shm.OpReserve || sqes[n-1].Op == shm.OpAcquire
		for i := 0; i < n; i++ {
			t0 := time.Now()
			later, err := s.dispatch(&sqes[i], &cqes[m])
			s.d.metrics.observeOp(sqes[i].Op, time.Since(t0))
			if err != nil {
				return fmt.Errorf("entry %d (%s, user_data %#x): %w", i, sqes[i].Op, sqes[i].UserData, err)
			}
			if later {
				s.outstanding++
				continue
			}
			m++
		}
		s.ring.DaemonPush(cqes[:m])
	}
}

// woken reports whether the loop has work besides submissions: finished
// promotions to complete, or a stop. Both are announced by
// DaemonInterrupt after they are made visible, so a wait that checks this
// never sleeps through them.
func (s *session) woken() bool { return len(s.deferred) > 0 || s.stopped() }

// drainDeferred turns promotions that finished into completions.
func (s *session) drainDeferred(out []shm.CQE) int {
	n := 0
	for n < len(out) {
		select {
		case d := <-s.deferred:
			s.outstanding--
			c := &out[n]
			*c = shm.CQE{UserData: d.userData}
			if d.err != nil && d.parked && errors.Is(d.err, tiers.ErrFull) {
				// Not a miss: a parked block is kept until resumed, and a
				// miss tells the client it is gone.
				s.log.Warn("promotion of a parked block found the host tier full", "err", d.err)
				c.Status = shm.StatusFull
			} else if d.err != nil {
				s.log.Warn("promotion failed; answering a miss", "err", d.err)
				c.Status = shm.StatusNotFound
			} else {
				s.nextToken++
				s.leases[s.nextToken] = d.hd
				c.Value, c.Offset, c.Tier, c.Flags = s.nextToken, uint64(d.hd.Offset), s.d.tierOf(d.hd), shm.CQEFlagPromoted
			}
			n++
		default:
			return n
		}
	}
	return n
}

// dispatch executes one validated entry. A returned error is a protocol
// violation that closes the session; an operation that merely fails
// completes with a status. later means the completion will come through
// s.deferred (an acquire waiting for a promotion).
func (s *session) dispatch(e *shm.SQE, c *shm.CQE) (later bool, err error) {
	*c = shm.CQE{UserData: e.UserData}
	if !e.Op.Valid() {
		return false, fmt.Errorf("unknown op %d", e.Op)
	}
	if !e.Op.FlagsValid(e.Flags) {
		return false, fmt.Errorf("flags %#x invalid for %s", e.Flags, e.Op)
	}
	s.d.ops[e.Op].Add(1)
	host, chain, gpus := s.d.host, s.d.chain, s.d.gpus
	key := tiers.Key{NS: s.nsID, Hash: e.Hash}
	gpu := -1 // the client's GPU, for entries that can take a GPU slot
	if e.Flags&shm.SQEFlagDevice != 0 {
		gpu = s.gpu
	}
	if e.Flags&shm.SQEFlagParked != 0 {
		key.NS |= tiers.ParkedNS
	}
	switch e.Op {
	case shm.OpNop:
	case shm.OpLookup:
		return false, s.lookup(e, c)
	case shm.OpReserve:
		if s.tokensFull() {
			c.Status = shm.StatusFull
			return false, nil
		}
		var h *tiers.Handle
		var err error
		if gpus != nil {
			h, err = gpus.Reserve(key, s.block, gpu)
		} else {
			h, err = chain.Reserve(key, s.block)
		}
		switch {
		case errors.Is(err, tiers.ErrExists):
			// Referenced again (resident past the lookup's first miss).
			if a, ok := s.pending[key]; ok {
				chain.Accessed(key, a)
			}
			c.Status = shm.StatusExists
		case errors.Is(err, tiers.ErrFull):
			c.Status = shm.StatusFull
		case err != nil:
			s.log.Error("reserve failed", "err", err)
			c.Status = shm.StatusInternal
		default:
			s.nextToken++
			s.res[s.nextToken] = h
			c.Value, c.Offset, c.Tier = s.nextToken, uint64(h.Offset), s.d.tierOf(h)
		}
	case shm.OpCommit, shm.OpAbort:
		h, ok := s.res[e.Token]
		if !ok {
			c.Status = shm.StatusNoToken
			return false, nil
		}
		delete(s.res, e.Token)
		var err error
		if g := gpuOf(gpus, h); g != nil {
			// A GPU slot: the GPU tier has no policy or parking.
			if e.Op == shm.OpCommit {
				if err = h.Owner().Commit(h); err == nil {
					gpus.Committed(g)
				}
			} else {
				err = h.Owner().Abort(h)
			}
		} else if e.Op == shm.OpCommit {
			err = host.Commit(h)
			switch {
			case err != nil:
			case h.Key.Parked():
				chain.Park(h.Key)
			default:
				chain.Inserted(h.Key, s.pending[h.Key])
				delete(s.pending, h.Key)
			}
			chain.Committed()
		} else {
			err = host.Abort(h)
		}
		if err != nil {
			s.log.Error("reservation state error", "op", e.Op, "err", err)
			c.Status = shm.StatusInternal
		}
	case shm.OpAcquire:
		if s.tokensFull() {
			c.Status = shm.StatusFull
			return false, nil
		}
		ud, parked := e.UserData, key.Parked()
		done := func(hd *tiers.Handle, err error) {
			s.deferred <- deferredCQE{userData: ud, hd: hd, err: err, parked: parked}
			s.interrupt()
		}
		var h *tiers.Handle
		var ok bool
		if gpus != nil {
			h, ok = gpus.Acquire(key, s.block, s.gpu, e.Flags&shm.SQEFlagDevice != 0, done)
		} else {
			h, ok = chain.Acquire(key, s.block, done)
		}
		switch {
		case !ok:
			c.Status = shm.StatusNotFound
		case h == nil:
			return true, nil // promotion from NVMe under way
		default:
			s.nextToken++
			s.leases[s.nextToken] = h
			c.Value, c.Offset, c.Tier = s.nextToken, uint64(h.Offset), s.d.tierOf(h)
		}
	case shm.OpRelease:
		h, ok := s.leases[e.Token]
		if !ok {
			c.Status = shm.StatusNoToken
			return false, nil
		}
		delete(s.leases, e.Token)
		if err := h.Owner().Release(h); err != nil {
			s.log.Error("lease state error", "err", err)
			c.Status = shm.StatusInternal
		}
	case shm.OpDelete:
		if gpus != nil {
			if !gpus.Delete(key) {
				c.Status = shm.StatusNotFound
			}
		} else if !chain.Delete(key) {
			c.Status = shm.StatusNotFound
		}
	}
	return false, nil
}

// tokensFull reports whether the session holds as many reservations and
// leases (granted or owed by a promotion) as it may.
func (s *session) tokensFull() bool {
	return len(s.res)+len(s.leases)+s.outstanding >= s.maxTokens
}

// lookup copies the chain out of the data area once, probes the index and
// writes one tier byte per key back.
func (s *session) lookup(e *shm.SQE, c *shm.CQE) error {
	kr, rr, err := e.LookupSpan(len(s.data))
	if err != nil {
		return err
	}
	n := int(e.Count)
	if cap(s.keys) < n {
		s.keys = make([]tiers.Key, n)
		s.tiersOut = make([]shm.Tier, n)
	}
	keys, out := s.keys[:n], s.tiersOut[:n]
	src := s.data[kr[0]:kr[1]]
	for i := range keys {
		keys[i] = tiers.Key{NS: s.nsID, Hash: shm.DecodeHash(src[i*shm.LookupKeySize:])}
	}
	clear(out)
	var hits int
	var req uint64
	if s.d.gpus != nil {
		hits, req = s.d.gpus.Lookup(keys, out)
	} else {
		hits, req = s.d.chain.Lookup(keys, out)
	}
	// Remember where the missing blocks sit in this chain: the client puts
	// them next, and the policy wants their place when they are committed.
	clear(s.pending)
	if hits < n {
		now := time.Now().UnixMilli()
		for i := hits; i < n && i < hits+maxPendingInfo; i++ {
			s.pending[keys[i]] = tiers.ChainInfo(keys, i, req, now)
		}
	}
	dst := s.data[rr[0]:rr[1]]
	for i := range dst {
		dst[i] = byte(out[i])
	}
	c.Value = uint64(hits)
	return nil
}

// gpuOf returns the GPU owning hd, nil for a host handle or without a GPU tier.
func gpuOf(gpus *tiers.GPUSet, hd *tiers.Handle) *tiers.GPU {
	if gpus == nil {
		return nil
	}
	return gpus.GPUOf(hd)
}
