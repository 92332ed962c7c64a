package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// Ring region layout. Every index that one side writes sits on its own
// cache line so producer and consumer never false-share.
//
//	0    header (magic, version, geometry) — written by the daemon at creation
//	64   sq tail   (client writes)
//	128  sq head   (daemon writes)
//	192  sq sleep flag, sq futex seq (daemon sleeps, client rings),
//	     cq room flag (daemon waits for room on the sq futex, client's pop rings)
//	256  cq tail   (daemon writes)
//	320  cq head   (client writes)
//	384  cq sleep flag, cq futex seq (client sleeps, daemon rings)
//	512  SQ entries, then CQ entries, then the data area, page aligned.
const (
	ringMagic   = 0x4b56_5247 // "KVRG"
	RingVersion = 1

	offSQTail  = 64
	offSQHead  = 128
	offSQSleep = 192
	offSQSeq   = 196
	offCQRoom  = 200
	offCQTail  = 256
	offCQHead  = 320
	offCQSleep = 384
	offCQSeq   = 388
	ringHdrLen = 512

	MinRingEntries = 8
	MaxRingEntries = 1 << 16
)

// ErrRingCorrupt means the peer wrote impossible ring indices or geometry.
var ErrRingCorrupt = errors.New("ring corrupt")

// RingLayout is the geometry of a session's ring region. Both sides derive
// offsets from it; the client receives it in the Welcome message and the
// daemon keeps its own copy (never re-reading the shared header).
type RingLayout struct {
	Entries  uint32 // SQ and CQ entry count, power of two
	DataSize uint32 // bytes of the data area used for batch keys/results
}

func (l RingLayout) sqOff() int   { return ringHdrLen }
func (l RingLayout) cqOff() int   { return ringHdrLen + int(l.Entries)*SQESize }
func (l RingLayout) DataOff() int { return alignUp(l.cqOff()+int(l.Entries)*CQESize, 4096) }

// Size is the total region size, page aligned.
func (l RingLayout) Size() int64 { return int64(alignUp(l.DataOff()+int(l.DataSize), 4096)) }

// Validate checks the geometry (also when it arrives from a peer).
func (l RingLayout) Validate() error {
	if l.Entries < MinRingEntries || l.Entries > MaxRingEntries || l.Entries&(l.Entries-1) != 0 {
		return fmt.Errorf("%w: ring entries %d not a power of two in [%d, %d]", ErrRingCorrupt, l.Entries, MinRingEntries, MaxRingEntries)
	}
	if l.DataSize > 1<<30 {
		return fmt.Errorf("%w: data area %d bytes too large", ErrRingCorrupt, l.DataSize)
	}
	return nil
}

func alignUp(n, a int) int { return (n + a - 1) &^ (a - 1) }

// Ring is a view of one session's rings over a mapped region. The daemon
// uses the Daemon* methods, the client the Client* methods; each side keeps
// the indices it owns privately.
type Ring struct {
	mem    []byte
	layout RingLayout
	mask   uint32

	sqTail, sqHead, sqSleep, sqSeq *atomic.Uint32
	cqTail, cqHead, cqSleep, cqSeq *atomic.Uint32
	// cqRoom: the daemon waits for the client to consume completions.
	cqRoom *atomic.Uint32

	// Private copies of the indices this side owns.
	localSQ uint32 // daemon: sq head; client: sq tail
	localCQ uint32 // daemon: cq tail; client: cq head
	// cqSeen (daemon): the completion head DaemonCQSpace last read.
	cqSeen uint32
}

// NewRing builds a view over mem (the ring region's mapping). init writes
// the header and zeroes the indices; only the creator (the daemon) does so.
func NewRing(mem []byte, l RingLayout, init bool) (*Ring, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if int64(len(mem)) < l.Size() {
		return nil, fmt.Errorf("%w: region %d bytes, layout needs %d", ErrRingCorrupt, len(mem), l.Size())
	}
	u32 := func(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }
	r := &Ring{
		mem: mem, layout: l, mask: l.Entries - 1,
		sqTail: u32(offSQTail), sqHead: u32(offSQHead), sqSleep: u32(offSQSleep), sqSeq: u32(offSQSeq),
		cqTail: u32(offCQTail), cqHead: u32(offCQHead), cqSleep: u32(offCQSleep), cqSeq: u32(offCQSeq),
		cqRoom: u32(offCQRoom),
	}
	if init {
		clear(mem[:ringHdrLen])
		binary.LittleEndian.PutUint32(mem[0:], ringMagic)
		binary.LittleEndian.PutUint32(mem[4:], RingVersion)
		binary.LittleEndian.PutUint32(mem[8:], l.Entries)
		binary.LittleEndian.PutUint32(mem[12:], l.DataSize)
	} else if binary.LittleEndian.Uint32(mem[0:]) != ringMagic || binary.LittleEndian.Uint32(mem[8:]) != l.Entries {
		return nil, fmt.Errorf("%w: header does not match the announced layout", ErrRingCorrupt)
	} else if v := binary.LittleEndian.Uint32(mem[4:]); v != RingVersion {
		// Another version's offsets: nothing in it may be read as ours.
		return nil, fmt.Errorf("%w: ring layout version %d, this build reads %d", ErrRingCorrupt, v, RingVersion)
	}
	return r, nil
}

// String reports the ring's shared words (indices and doorbells), for
// diagnostics: either side may call it at any time, and it reads no state
// private to a side.
func (r *Ring) String() string {
	return fmt.Sprintf("sq tail %d head %d sleep %d seq %d; cq tail %d head %d sleep %d seq %d room %d",
		r.sqTail.Load(), r.sqHead.Load(), r.sqSleep.Load(), r.sqSeq.Load(),
		r.cqTail.Load(), r.cqHead.Load(), r.cqSleep.Load(), r.cqSeq.Load(), r.cqRoom.Load())
}

// Layout returns the ring geometry.
func (r *Ring) Layout() RingLayout { return r.layout }

// Data is the session's data area (batch keys and results).
func (r *Ring) Data() []byte {
	off := r.layout.DataOff()
	return r.mem[off : off+int(r.layout.DataSize) : off+int(r.layout.DataSize)]
}

func (r *Ring) sqe(i uint32) []byte {
	off := r.layout.sqOff() + int(i&r.mask)*SQESize
	return r.mem[off : off+SQESize : off+SQESize]
}

func (r *Ring) cqe(i uint32) []byte {
	off := r.layout.cqOff() + int(i&r.mask)*CQESize
	return r.mem[off : off+CQESize : off+CQESize]
}

// ---- client side ----

// ClientSQSpace is how many SQEs can be pushed now.
func (r *Ring) ClientSQSpace() int {
	return int(r.layout.Entries - (r.localSQ - r.sqHead.Load()))
}

// ClientPush appends entries to the submission ring and returns how many fit.
// It does not ring the doorbell; call ClientWake after a batch.
func (r *Ring) ClientPush(es []SQE) int {
	space := r.ClientSQSpace()
	if space < 0 || space > int(r.layout.Entries) {
		// The daemon published an impossible head; push nothing.
		return 0
	}
	n := min(space, len(es))
	for i := 0; i < n; i++ {
		es[i].Encode(r.sqe(r.localSQ + uint32(i)))
	}
	r.localSQ += uint32(n)
	r.sqTail.Store(r.localSQ)
	return n
}

// ClientNeedsWake reports whether entries pushed so far need the doorbell:
// the daemon announced that it is going to sleep. Read after ClientPush,
// false means the loop is polling and will find them (it re-checks the ring
// after announcing a sleep, so an announcement after this read is covered).
func (r *Ring) ClientNeedsWake() bool { return r.sqSleep.Load() != 0 }

// ClientWake rings the daemon's doorbell if it went to sleep.
func (r *Ring) ClientWake() {
	if r.sqSleep.Load() != 0 {
		r.sqSeq.Add(1)
		futexWakeAll(r.sqSeq)
	}
}

// ClientPop moves up to len(dst) completions out of the completion ring.
func (r *Ring) ClientPop(dst []CQE) int {
	avail := r.cqTail.Load() - r.localCQ
	if avail > r.layout.Entries {
		return 0
	}
	n := min(int(avail), len(dst))
	for i := 0; i < n; i++ {
		dst[i].Decode(r.cqe(r.localCQ + uint32(i)))
	}
	r.localCQ += uint32(n)
	r.cqHead.Store(r.localCQ)
	if n > 0 && r.cqRoom.Load() != 0 {
		// The daemon waits for room in the completion ring (DaemonWaitRoom).
		r.sqSeq.Add(1)
		futexWakeAll(r.sqSeq)
	}
	return n
}

// ClientPending reports whether completions are waiting. It reads the
// published head rather than the private copy so that it may be called
// while another goroutine pops.
func (r *Ring) ClientPending() bool { return r.cqTail.Load() != r.cqHead.Load() }

// ClientWait blocks until a completion may be available, more (if not
// nil) reports true, or d passes. It spins for spin first, then sleeps on
// the completion futex. Whoever makes more true must call ClientInterrupt
// afterwards (see DaemonWaitPaced).
func (r *Ring) ClientWait(spin, d time.Duration, more func() bool) {
	ready := r.ClientPending
	if more != nil {
		ready = func() bool { return r.ClientPending() || more() }
	}
	waitOn(ready, r.cqSleep, r.cqSeq, spin, nil, d)
}

// ClientInterrupt wakes a ClientWait in this process (used at close).
func (r *Ring) ClientInterrupt() {
	r.cqSeq.Add(1)
	futexWakeAll(r.cqSeq)
}

// ---- daemon side ----

// DaemonPop validates the client's tail and decodes up to len(dst) entries.
// The entries are copied out of shared memory before anything looks at them.
func (r *Ring) DaemonPop(dst []SQE) (int, error) {
	tail := r.sqTail.Load()
	avail := tail - r.localSQ
	if avail > r.layout.Entries {
		return 0, fmt.Errorf("%w: submission tail %d is %d entries past head %d (ring holds %d)", ErrRingCorrupt, tail, avail, r.localSQ, r.layout.Entries)
	}
	n := min(int(avail), len(dst))
	for i := 0; i < n; i++ {
		dst[i].Decode(r.sqe(r.localSQ + uint32(i)))
	}
	r.localSQ += uint32(n)
	r.sqHead.Store(r.localSQ)
	return n, nil
}

// DaemonCQSpace validates the client's completion head and returns the free
// completion slots.
func (r *Ring) DaemonCQSpace() (int, error) {
	head := r.cqHead.Load()
	r.cqSeen = head
	used := r.localCQ - head
	if used > r.layout.Entries {
		return 0, fmt.Errorf("%w: completion head %d is %d entries behind tail %d (ring holds %d)", ErrRingCorrupt, head, used, r.localCQ, r.layout.Entries)
	}
	return int(r.layout.Entries - used), nil
}

// DaemonPush publishes completions; the caller checked DaemonCQSpace. It
// wakes the client if it sleeps.
func (r *Ring) DaemonPush(cs []CQE) {
	for i := range cs {
		cs[i].Encode(r.cqe(r.localCQ + uint32(i)))
	}
	r.localCQ += uint32(len(cs))
	r.cqTail.Store(r.localCQ)
	if r.cqSleep.Load() != 0 {
		r.cqSeq.Add(1)
		futexWakeAll(r.cqSeq)
	}
}

// DaemonPending reports whether the client published entries.
func (r *Ring) DaemonPending() bool { return r.sqTail.Load() != r.localSQ }

// DaemonWait blocks until submissions may be available or d passes.
func (r *Ring) DaemonWait(spin, d time.Duration) {
	waitOn(r.DaemonPending, r.sqSleep, r.sqSeq, spin, nil, d)
}

// DaemonWaitPaced is DaemonWait with a Pacer kept across waits (see
// Spinner) that also returns when more, if not nil, reports work of the
// daemon's own: completions that other goroutines hand the ring loop. Who
// makes more true must call DaemonInterrupt afterwards; then the wake-up
// cannot be lost, whether it comes before the wait reads the sequence
// word (more is true when checked) or after (the futex sees a new value).
func (r *Ring) DaemonWaitPaced(spin time.Duration, p *Pacer, d time.Duration, more func() bool) {
	waitOn(r.daemonReady(more), r.sqSleep, r.sqSeq, spin, p, d)
}

// DaemonSpin is the spin of DaemonWaitPaced without its sleep: it polls
// for submissions, or more (if not nil), for up to spin paced by p, and
// reports whether either came.
func (r *Ring) DaemonSpin(spin time.Duration, p *Pacer, more func() bool) bool {
	return spinFor(r.daemonReady(more), spin, p)
}

// spinFor polls ready for up to spin, paced by p, and reports whether it
// became true.
func spinFor(ready func() bool, spin time.Duration, p *Pacer) bool {
	if ready() {
		return true
	}
	if spin <= 0 {
		return false
	}
	var sp Spinner
	sp.Reset(spin, p)
	for sp.Pause() {
		if ready() {
			return true
		}
	}
	return false
}

// DaemonPollQuick polls the submission ring briefly (see Pacer.Hot) and
// reports whether entries arrived; p learns from the outcome, which is
// about the client alone (a wait that follows checks the daemon's own
// work first).
func (r *Ring) DaemonPollQuick(p *Pacer) bool { return p.pollQuick(r.DaemonPending) }

func (r *Ring) daemonReady(more func() bool) func() bool {
	if more == nil {
		return r.DaemonPending
	}
	return func() bool { return r.DaemonPending() || more() }
}

// DaemonWaitRoom blocks until the client consumes completions (moves the
// completion head from where the last DaemonCQSpace saw it), more (if not
// nil) reports true, or d passes: for a loop that can take nothing while
// the completion ring is full. It
// announces the wait in a flag of its own, on which ClientPop rings the
// doorbell; the client's pushes, which the loop cannot take, do not ring
// it. DaemonInterrupt ends it too.
func (r *Ring) DaemonWaitRoom(d time.Duration, more func() bool) {
	ready := func() bool { return r.cqHead.Load() != r.cqSeen || (more != nil && more()) }
	waitOn(ready, r.cqRoom, r.sqSeq, 0, nil, d)
}

// DaemonInterrupt wakes a DaemonWait (used to stop a session and to hand
// the ring loop a completion).
func (r *Ring) DaemonInterrupt() {
	r.sqSeq.Add(1)
	futexWakeAll(r.sqSeq)
}

// waitOn is the doorbell protocol: spin, then announce sleep, re-check, and
// sleep on the sequence word. The producer publishes its tail before it
// reads the sleep flag; with sequentially consistent atomics on both sides a
// wake-up cannot be lost. Sleeps are bounded by d because the peer is not
// trusted to ring at all.
func waitOn(ready func() bool, sleep, seq *atomic.Uint32, spin time.Duration, p *Pacer, d time.Duration) {
	if spinFor(ready, spin, p) {
		return
	}
	sleep.Store(1)
	s := seq.Load()
	if !ready() {
		futexWaitOn(seq, s, d)
	}
	sleep.Store(0)
}
