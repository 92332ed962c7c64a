package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
)

// ErrNoDevice: a device call on a client opened without a GPU.
var ErrNoDevice = errors.New("kvtier: client has no GPU (Options.Device or Options.GPU)")

// openGPU opens the GPU named by an ordinal or a UUID string.
func openGPU(name string) (cudaipc.Device, error) {
	devs, err := cudaipc.Devices()
	if err != nil {
		return nil, fmt.Errorf("open GPU %q: %w", name, err)
	}
	var pick cudaipc.Device
	ord, oerr := strconv.Atoi(name)
	for _, d := range devs {
		info := d.Info()
		if pick == nil && ((oerr == nil && info.Ordinal == ord) || strings.EqualFold(info.UUID.String(), name)) {
			pick = d
			continue
		}
		d.Close()
	}
	if pick == nil {
		return nil, fmt.Errorf("open GPU %q: no such device", name)
	}
	return pick, nil
}

// openGPU receives the daemon's arena on this client's GPU (the message
// after a Welcome with WelcomeFlagGPU), maps it, and registers the host arena
// as pinned.
func (cn *conn) openGPU(ctx context.Context) error {
	dev := cn.s.c.dev
	if dev == nil {
		return fmt.Errorf("%w: daemon sent a GPU arena to a client without a GPU", shm.ErrMalformed)
	}
	dl := time.Now().Add(cn.s.c.opts.DialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	cn.sock.SetDeadline(dl)
	defer cn.sock.SetDeadline(time.Time{})
	buf := make([]byte, 4096)
	raw, _, err := shm.RecvMsg(cn.sock, buf, 0)
	if err != nil {
		return fmt.Errorf("%w: gpu arena: %v", ErrDisconnected, err)
	}
	t, _, payload, err := shm.DecodeMsg(raw)
	if err != nil {
		return err
	}
	if t != shm.MsgGPUArena {
		return fmt.Errorf("%w: expected gpu arena, got message type %d", shm.ErrMalformed, t)
	}
	ga, err := shm.DecodeGPUArena(payload)
	if err != nil {
		return err
	}
	if cudaipc.UUID(ga.UUID) != dev.Info().UUID {
		return fmt.Errorf("%w: gpu arena of %s, this client is on %s", shm.ErrMalformed, cudaipc.UUID(ga.UUID), dev.Info().UUID)
	}
	m, err := dev.OpenIPC(cudaipc.IPCHandle(ga.Handle))
	if err != nil {
		return fmt.Errorf("open the daemon's GPU arena: %w", err)
	}
	if uint64(m.Size()) < ga.Size {
		m.Close()
		return fmt.Errorf("%w: gpu arena maps %d bytes, daemon announced %d", shm.ErrMalformed, m.Size(), ga.Size)
	}
	cn.gpu, cn.gpuSize = m, ga.Size
	cn.s.c.devUse()
	// Pinned host memory makes D2H/H2D copies of host slots DMA at full
	// speed; without it they still work, staged by the driver.
	cn.hostPinned = dev.RegisterHost(cn.mem) == nil
	return nil
}

// closeGPU undoes openGPU (the last user of the mappings is gone).
func (cn *conn) closeGPU() {
	if cn.hostPinned {
		cn.s.c.dev.UnregisterHost(cn.mem)
		cn.hostPinned = false
	}
	if cn.gpu != nil {
		cn.gpu.Close()
		cn.gpu = nil
		cn.s.c.devDone()
	}
}

// devSlot returns the device address of a completion's GPU slot, checked
// against the mapped arena.
func (cn *conn) devSlot(c *shm.CQE) (cudaipc.DevicePtr, error) {
	if cn.gpu == nil {
		return 0, fmt.Errorf("%w: daemon returned a GPU slot without a GPU arena", shm.ErrMalformed)
	}
	if err := shm.CheckSlot(c.Offset, cn.welcome.BlockBytes, cn.gpuSize); err != nil {
		return 0, err
	}
	return cn.gpu.Ptr() + cudaipc.DevicePtr(c.Offset), nil
}

// DeviceOp is a batch of block copies between this client's GPU and the
// daemon's tiers, queued on the caller's stream. The call that returns it
// does not wait for the copies: it reserves (put) or leases (get) the slots,
// queues one copy per block and records an event after them. When that event
// completes, the client commits the reservations (put) or releases the
// leases (get) from a goroutine of its own (one per op, started by the
// goroutine that waits for the events of its stream); Done is closed after
// that. Until then the slots stay reserved or leased, so the daemon neither
// hands them out nor moves them while the device reads or writes them.
// Nothing waits for the whole device or context.
//
// A put whose context ends before the event completes is aborted at the event
// (never earlier: the copy may still be writing the slot). A session closed
// with copies in flight waits for their events; a client that dies with
// copies in flight leaks nothing: the daemon aborts and releases everything
// its session held.
type DeviceOp struct {
	put bool
	// ctx is the put's own context: canceled before the event, the put is
	// aborted instead of committed. Kept because the commit happens after
	// the call returned.
	ctx    context.Context
	hashes []Hash
	tiers  []Tier
	res    []*Reservation // put
	leases []*Lease       // get
	ev     cudaipc.Event  // nil: the copies completed before the op was queued
	c      *Client
	s      *Session
	// failed is an error of the call itself (a copy that could not be
	// queued): everything is given back at the event.
	failed error
	// skipped: reservations the daemon refused (ErrFull, ...), reported by
	// Err along with the outcome of the others.
	skipped error

	done   chan struct{}
	err    error
	stored int
}

// Done is closed once every block of the op is committed or aborted (put)
// or released (get).
func (op *DeviceOp) Done() <-chan struct{} { return op.done }

// Wait waits for the op (Done) and returns its error. When ctx ends first it
// returns ctx's error; the op carries on regardless (a put still commits
// unless its own context ended).
func (op *DeviceOp) Wait(ctx context.Context) error {
	select {
	case <-op.done:
		return op.err
	case <-ctx.Done():
		return fmt.Errorf("wait for device op: %w", ctx.Err())
	}
}

// Err is the op's outcome once Done is closed (nil before): the copy's
// error, the commit statuses, the cancellation of a put's context, and
// reservations the daemon refused (ErrFull).
func (op *DeviceOp) Err() error {
	select {
	case <-op.done:
		return op.err
	default:
		return nil
	}
}

// Len is the number of blocks the op was called with.
func (op *DeviceOp) Len() int { return len(op.hashes) }

// Tier is where block i's slot is: for a put, the tier its copy went to
// (TierNone: already cached, or refused); for a get, the tier it is read
// from (TierNone: a miss, no copy queued).
func (op *DeviceOp) Tier(i int) Tier { return op.tiers[i] }

// Stored is the number of blocks a put committed (valid once Done is
// closed).
func (op *DeviceOp) Stored() int {
	select {
	case <-op.done:
		return op.stored
	default:
		return 0
	}
}

// beginDev counts a device op of the session in flight; Close waits for
// its copies, because the daemon frees a closed session's slots at once
// while the device may still be copying into or out of them, and (bounded)
// for its commits.
func (s *Session) beginDev() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.devCopies.Add(1)
	s.devOps.Add(1)
	return nil
}

// endDev ends an op beginDev counted that queued no copy (completeStream
// ends the others, the copies as their event completes).
func (s *Session) endDev() {
	s.devCopies.Done()
	s.devOps.Done()
}

// devCtx is ctx, also ended (cause ErrClosed) when Close begins: for a
// device op's reserves or leases. Counted in devCopies from its start, an op
// still waiting for them would hold Close's unbounded wait for the copies as
// long as the daemon does not answer.
func (s *Session) devCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	dctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.closing, func() { cancel(ErrClosed) })
	return dctx, func() {
		stop()
		cancel(nil)
	}
}

// devErr is err of a device op's reserves or leases, ErrClosed when Close
// ended their wait.
func devErr(dctx context.Context, err error) error {
	if errors.Is(err, context.Canceled) && errors.Is(context.Cause(dctx), ErrClosed) {
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	return err
}

// PutFromDeviceAsync stores the block at src (device memory of this
// client's GPU, BlockBytes long) under h without waiting for the copy: see
// PutFromDeviceBatch.
func (s *Session) PutFromDeviceAsync(ctx context.Context, h Hash, src cudaipc.DevicePtr, stream cudaipc.Stream) (*DeviceOp, error) {
	return s.PutFromDeviceBatch(ctx, []Hash{h}, []cudaipc.DevicePtr{src}, stream)
}

// PutFromDeviceBatch stores blocks from device memory of this client's GPU
// (srcs[i], BlockBytes long, under hashes[i]) with one reservation round
// trip. For each block the daemon assigns a slot in its arena on this GPU
// when it has room (a D2D copy through the IPC mapping), else a host slot (a
// D2H copy into the pinned host arena). The copies are queued on stream
// after whatever the caller queued there (the kernels that produced the
// blocks), and the call returns once they are queued; the reservations are
// committed when an event recorded after them completes (DeviceOp). Blocks
// already cached are skipped (Tier(i) == TierNone). When the daemon has no
// room for any block the call fails with ErrFull; when it refused only some,
// the op's Err reports ErrFull for them.
func (s *Session) PutFromDeviceBatch(ctx context.Context, hashes []Hash, srcs []cudaipc.DevicePtr, stream cudaipc.Stream) (*DeviceOp, error) {
	if s.c.dev == nil {
		return nil, ErrNoDevice
	}
	if len(hashes) != len(srcs) {
		return nil, fmt.Errorf("put from device: %d hashes for %d sources", len(hashes), len(srcs))
	}
	if err := s.beginDev(); err != nil {
		return nil, err
	}
	dctx, stop := s.devCtx(ctx)
	rs, rerr := s.reserveBatch(dctx, hashes, shm.SQEFlagDevice)
	rerr = devErr(dctx, rerr)
	stop()
	if rs == nil {
		s.endDev()
		return nil, fmt.Errorf("put from device: %w", rerr)
	}
	op := &DeviceOp{put: true, ctx: ctx, hashes: hashes, tiers: make([]Tier, len(hashes)), res: rs,
		c: s.c, s: s, skipped: rerr, done: make(chan struct{})}
	dev, n := s.c.dev, int64(s.ns.BlockBytes)
	queued := 0
	for i, r := range rs {
		if r == nil {
			continue
		}
		op.tiers[i] = r.tier
		var err error
		if r.tier == TierGPU {
			err = dev.CopyDtoDAsync(r.dptr, srcs[i], n, stream)
		} else {
			err = dev.CopyDtoHAsync(r.buf, srcs[i], stream)
		}
		if err != nil {
			op.failed = fmt.Errorf("put %s from device: %w", hashes[i], err)
			break
		}
		queued++
	}
	if queued == 0 && op.failed == nil {
		// Nothing to copy: every block was cached already or refused.
		op.finish(nil)
		s.endDev()
		if rerr != nil {
			return nil, fmt.Errorf("put from device: %w", rerr)
		}
		return op, nil
	}
	return s.queueDev(op, stream)
}

// GetToDeviceAsync copies the cached block h into dst (device memory of
// this client's GPU): see GetToDeviceBatch. ErrNotFound on a miss.
func (s *Session) GetToDeviceAsync(ctx context.Context, h Hash, dst cudaipc.DevicePtr, stream cudaipc.Stream) (*DeviceOp, error) {
	op, err := s.GetToDeviceBatch(ctx, []Hash{h}, []cudaipc.DevicePtr{dst}, stream)
	if err != nil {
		return nil, err
	}
	if op.Tier(0) == TierNone {
		return nil, ErrNotFound
	}
	return op, nil
}

// GetToDeviceBatch copies cached blocks into device memory of this client's
// GPU (hashes[i] into dsts[i]) with one acquire round trip: D2D from the
// daemon's arena on this GPU when a block is (or is brought, by promotion
// from the host tier or migration from another GPU) there, else H2D from the
// pinned host arena. The copies are queued on stream and the call returns
// once they are queued: work queued on stream afterwards sees the blocks.
// The leases are released when an event recorded after the copies completes
// (DeviceOp). Misses are Tier(i) == TierNone, with nothing copied.
func (s *Session) GetToDeviceBatch(ctx context.Context, hashes []Hash, dsts []cudaipc.DevicePtr, stream cudaipc.Stream) (*DeviceOp, error) {
	if s.c.dev == nil {
		return nil, ErrNoDevice
	}
	if len(hashes) != len(dsts) {
		return nil, fmt.Errorf("get to device: %d hashes for %d destinations", len(hashes), len(dsts))
	}
	if err := s.beginDev(); err != nil {
		return nil, err
	}
	dctx, stop := s.devCtx(ctx)
	ls, err := s.acquireBatch(dctx, hashes, shm.SQEFlagDevice)
	err = devErr(dctx, err)
	stop()
	if err != nil {
		s.endDev()
		return nil, fmt.Errorf("get to device: %w", err)
	}
	op := &DeviceOp{hashes: hashes, tiers: make([]Tier, len(hashes)), leases: ls, c: s.c, s: s, done: make(chan struct{})}
	dev, n := s.c.dev, int64(s.ns.BlockBytes)
	queued := 0
	for i, l := range ls {
		if l == nil {
			continue
		}
		op.tiers[i] = l.Tier
		var err error
		if l.Tier == TierGPU {
			err = dev.CopyDtoDAsync(dsts[i], l.dptr, n, stream)
		} else {
			err = dev.CopyHtoDAsync(dsts[i], l.buf, stream)
		}
		if err != nil {
			op.failed = fmt.Errorf("get %s to device: %w", hashes[i], err)
			break
		}
		queued++
	}
	if queued == 0 && op.failed == nil {
		op.finish(nil) // all misses
		s.endDev()
		return op, nil
	}
	return s.queueDev(op, stream)
}

// queueDev records op's event on stream and hands op to the stream's
// completer. A copy that could not be queued fails the call; what was
// granted is still given back only after the copies queued before it.
func (s *Session) queueDev(op *DeviceOp, stream cudaipc.Stream) (*DeviceOp, error) {
	c := s.c
	ev, err := c.event()
	if err == nil {
		if err = ev.Record(stream); err != nil {
			c.recycle(ev)
		}
	}
	if err != nil {
		// Without an event the only way to know the copies are done is
		// the stream itself (an error path: the caller's stream is broken).
		if serr := stream.Synchronize(); serr != nil {
			err = errors.Join(err, serr)
		}
		if op.failed == nil {
			op.failed = fmt.Errorf("record event after device copies: %w", err)
		}
	} else {
		op.ev = ev
	}
	c.enqueueDev(stream, op)
	if op.failed != nil {
		return nil, op.failed
	}
	return op, nil
}

// streamQueue holds the device ops of one stream in the order their events
// were recorded (the order they complete in).
type streamQueue struct{ ops []*DeviceOp }

func (c *Client) enqueueDev(stream cudaipc.Stream, op *DeviceOp) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	q := c.queues[stream]
	if q == nil {
		q = &streamQueue{}
		c.queues[stream] = q
		go c.completeStream(stream, q)
	}
	q.ops = append(q.ops, op)
}

// completeStream waits for the events of one stream's ops in order and
// hands each op to a goroutine that finishes it (commits or releases), then
// exits (a stream with nothing in flight has no goroutine). Events of one
// stream complete in order, so waiting on the oldest never delays a younger
// one (nor does an older op's finish); other streams have completers of
// their own. Ops of one stream may finish out of order.
func (c *Client) completeStream(stream cudaipc.Stream, q *streamQueue) {
	for {
		c.qmu.Lock()
		if len(q.ops) == 0 {
			delete(c.queues, stream)
			c.qmu.Unlock()
			return
		}
		op := q.ops[0]
		q.ops[0] = nil
		q.ops = q.ops[1:]
		c.qmu.Unlock()
		var err error
		if op.ev != nil {
			if err = op.ev.Synchronize(); err != nil {
				err = fmt.Errorf("device copies: %w", err)
			}
			c.recycle(op.ev)
			op.ev = nil
		}
		op.s.devCopies.Done()
		// The finish waits for the daemon's answers without a deadline:
		// inline, a daemon that stopped answering held the events of the
		// younger ops (of any session on this stream) uncounted, and
		// Session.Close, which waits for every copy before it bounds the
		// wait for answers, waited for good.
		go func() {
			op.finish(err)
			op.s.devOps.Done()
		}()
	}
}

// finish commits or aborts a put's reservations, or releases a get's leases,
// once the copies are done (copyErr: they failed), and closes done.
func (op *DeviceOp) finish(copyErr error) {
	var errs []error
	if op.failed != nil {
		errs = append(errs, op.failed)
	}
	if copyErr != nil {
		errs = append(errs, copyErr)
	}
	if op.put {
		fin := shm.OpCommit
		if len(errs) == 0 && op.ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("put from device aborted: %w", context.Cause(op.ctx)))
		}
		if len(errs) > 0 {
			fin = shm.OpAbort
		}
		// Not op.ctx: the commit must reach the daemon even if the
		// caller's context ends meanwhile (the connection's death bounds
		// it).
		n, err := finishBatch(context.Background(), op.res, fin)
		if fin == shm.OpCommit {
			op.stored = n
		}
		if err != nil {
			errs = append(errs, err)
		}
		if op.skipped != nil {
			errs = append(errs, op.skipped)
		}
	} else {
		for _, l := range op.leases {
			if l != nil {
				if err := l.Release(); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	op.err = errors.Join(errs...)
	close(op.done)
}

// event takes an event from the client's pool (creating events is a driver
// call; an inference engine queues thousands of ops a second).
func (c *Client) event() (cudaipc.Event, error) {
	c.qmu.Lock()
	if n := len(c.events); n > 0 {
		ev := c.events[n-1]
		c.events = c.events[:n-1]
		c.qmu.Unlock()
		return ev, nil
	}
	c.qmu.Unlock()
	ev, err := c.dev.NewEvent()
	if err != nil {
		return nil, fmt.Errorf("new event: %w", err)
	}
	return ev, nil
}

const maxPooledEvents = 256

func (c *Client) recycle(ev cudaipc.Event) {
	c.qmu.Lock()
	if len(c.events) < maxPooledEvents && !c.eventsClosed {
		c.events = append(c.events, ev)
		ev = nil
	}
	c.qmu.Unlock()
	if ev != nil {
		ev.Close()
	}
}

// closeEvents destroys the pooled events (Client.Close, after the sessions
// and with them every op in flight).
func (c *Client) closeEvents() {
	c.qmu.Lock()
	evs := c.events
	c.events, c.eventsClosed = nil, true
	c.qmu.Unlock()
	for _, ev := range evs {
		ev.Close()
	}
}

// PutFromDevice stores the block at src under h and waits until it is
// committed: PutFromDeviceAsync, then Wait. stored is false when the block
// was already cached. Only this goroutine waits, for an event recorded after
// the copy, never for the device.
func (s *Session) PutFromDevice(ctx context.Context, h Hash, src cudaipc.DevicePtr, stream cudaipc.Stream) (stored bool, err error) {
	op, err := s.PutFromDeviceAsync(ctx, h, src, stream)
	if err != nil {
		return false, err
	}
	if err := op.Wait(ctx); err != nil {
		return false, err
	}
	return op.Stored() == 1, nil
}

// GetToDevice copies the cached block h into dst and returns the tier it
// was read from once the copy is queued on stream (work queued on stream
// afterwards sees the block; the lease is released at an event recorded
// after the copy). ErrNotFound on a miss. Use GetToDeviceAsync to learn when
// the copy completed or whether it failed.
func (s *Session) GetToDevice(ctx context.Context, h Hash, dst cudaipc.DevicePtr, stream cudaipc.Stream) (Tier, error) {
	op, err := s.GetToDeviceAsync(ctx, h, dst, stream)
	if err != nil {
		return TierNone, err
	}
	return op.Tier(0), nil
}
