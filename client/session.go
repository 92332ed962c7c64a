package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/internal/memcopy"
	"github.com/kvtier/kvtier/shm"
)

// Session is a connection to kvtierd for one namespace. It reconnects by
// itself after the daemon restarts. Safe for concurrent use.
type Session struct {
	c  *Client
	ns Namespace

	mu     sync.Mutex // guards cur, closed and the reconnect in progress
	cur    *conn
	closed bool
	// A reconnect in progress (one at a time): dialing is closed when it
	// ends, dialCancel ends it early (Close). Not under mu: a stalled
	// daemon must not hold the session's other callers past their
	// contexts, nor Close.
	dialing    chan struct{}
	dialCancel context.CancelFunc
	// devCopies counts device ops whose copies may still run, devOps
	// those not finished (their commits or releases sent, a commit's
	// answer in); both Add only under mu while !closed (device.go).
	devCopies, devOps sync.WaitGroup
	// closeDone is closed when the first Close has finished; later Closes
	// wait for it.
	closeDone chan struct{}
	// closing is ended when Close begins: it ends the waits of device ops
	// for their reserves or leases (devCtx), which Close's wait for
	// devCopies would otherwise wait for without a bound.
	closing    context.Context
	endClosing context.CancelFunc
}

// Namespace is the session's namespace.
func (s *Session) Namespace() Namespace { return s.ns }

// NamespaceID is the daemon's stable id for the namespace.
func (s *Session) NamespaceID() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return 0
	}
	return s.cur.welcome.NamespaceID
}

// BlockBytes is the namespace's block size.
func (s *Session) BlockBytes() int { return int(s.ns.BlockBytes) }

// conn returns the live connection, reconnecting if the last one died. A
// caller that finds another reconnecting waits for it, bounded by its own
// context.
func (s *Session) conn(ctx context.Context) (*conn, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		if s.cur != nil && !s.cur.isDead() {
			cn := s.cur
			s.mu.Unlock()
			return cn, nil
		}
		if ch := s.dialing; ch != nil {
			s.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ch := make(chan struct{})
		dctx, cancel := context.WithCancel(ctx)
		s.dialing, s.dialCancel = ch, cancel
		s.mu.Unlock()

		cn, err := s.dial(dctx)
		cancel()
		s.mu.Lock()
		s.dialing, s.dialCancel = nil, nil
		closed := s.closed
		if !closed && err == nil {
			s.cur = cn
		}
		s.mu.Unlock()
		if closed && cn != nil {
			cn.kill(ErrClosed)
			cn.wait()
		}
		close(ch) // after the kill: Close waits for it
		switch {
		case closed:
			return nil, ErrClosed
		case err != nil:
			return nil, fmt.Errorf("reconnect: %w", err)
		}
		return cn, nil
	}
}

// Close ends the session. Open leases stay readable until released. Device
// copies in flight (DeviceOp) are waited for first: their events complete,
// so that no slot goes back to the daemon while a copy still touches it;
// then their reservations are committed (or aborted) and their leases
// released. Close waits for the commits' answers up to closeAnswerWait: a
// daemon that stopped answering (SIGSTOP, a hung disk) does not hold the
// engine's Close for good (those puts then end with the connection's
// error). Device puts and gets still waiting for their reserves or leases
// when Close begins (no copy queued yet) fail with ErrClosed. A Close that
// finds another in progress waits for it.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.closeDone // a concurrent Close may still be waiting for copies
		return nil
	}
	s.closed = true
	dialing := s.dialing
	if dialing != nil {
		s.dialCancel() // its dialer kills what it got (closed is set)
	}
	s.mu.Unlock()
	defer close(s.closeDone)
	if dialing != nil {
		<-dialing
	}
	s.endClosing() // device ops not yet copying give up their reserves
	s.devCopies.Wait()
	waitBounded(&s.devOps, closeAnswerWait)
	s.mu.Lock()
	cn := s.cur
	s.mu.Unlock()
	if cn != nil {
		cn.kill(ErrClosed)
		cn.wait()
	}
	s.devOps.Wait() // at once now: the connection's death ends every wait
	s.c.forget(s)
	return nil
}

// closeAnswerWait bounds how long Close waits for the daemon to answer the
// commits of device puts whose copies are done (a var: tests shorten it).
var closeAnswerWait = 5 * time.Second

// waitBounded waits for wg for at most d, reporting whether it is done.
func waitBounded(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func statusErr(st shm.Status) error {
	switch st {
	case shm.StatusOK:
		return nil
	case shm.StatusNotFound:
		return ErrNotFound
	case shm.StatusFull:
		return ErrFull
	case shm.StatusNoToken:
		return ErrDone
	}
	return fmt.Errorf("kvtier: daemon answered %s", st)
}

// Reservation is a slot reserved for a new block: write Bytes, then Commit
// (or Abort).
type Reservation struct {
	Hash  Hash
	cn    *conn
	token uint64
	buf   []byte            // a host slot
	tier  Tier              // TierGPU: the slot is dptr in the daemon's GPU arena
	dptr  cudaipc.DevicePtr // (device puts only)
	done  atomic.Bool
}

// Bytes is the slot to write the block into (the namespace's block size).
// Write only before Commit or Abort: after them the slot is the daemon's
// again (a published block, or another put's slot).
func (r *Reservation) Bytes() []byte { return r.buf }

// Commit publishes the block; Lookup and Acquire see it once Commit returns.
func (r *Reservation) Commit(ctx context.Context) error {
	return r.finish(ctx, shm.OpCommit)
}

// Abort gives the slot back without publishing.
func (r *Reservation) Abort(ctx context.Context) error {
	return r.finish(ctx, shm.OpAbort)
}

func (r *Reservation) finish(ctx context.Context, op shm.Op) error {
	if !r.done.CompareAndSwap(false, true) {
		return ErrDone
	}
	defer r.cn.unref()
	var out [1]shm.CQE
	if err := r.cn.submit(ctx, []shm.SQE{{Op: op, Token: r.token}}, out[:]); err != nil {
		return fmt.Errorf("%s %s: %w", op, r.Hash, err)
	}
	if err := statusErr(out[0].Status); err != nil {
		return fmt.Errorf("%s %s: %w", op, r.Hash, err)
	}
	return nil
}

// Lease pins a cached block for reading until Release.
type Lease struct {
	Hash Hash
	// Tier is where the leased slot lives; Promoted says the block was
	// swapped in from a slower tier to serve this lease.
	Tier     Tier
	Promoted bool
	cn       *conn
	token    uint64
	buf      []byte            // a host slot
	dptr     cudaipc.DevicePtr // Tier == TierGPU (device gets only)
	done     atomic.Bool
}

// Bytes is the block (read-only by contract: other readers share it). It is
// valid until Release: after that the slot goes back to the daemon, and the
// slice, still mapped, may read another block's bytes without any error.
// Copy out what must outlive the lease.
func (l *Lease) Bytes() []byte { return l.buf }

// Release unpins the block. It does not wait for the daemon: the session's
// rings are ordered, so later calls of this session see it released. It
// rings no doorbell of its own: a ring loop that is polling takes it at
// once, a sleeping one with the session's next call or a 200 µs timer,
// whichever comes first.
func (l *Lease) Release() error {
	if !l.done.CompareAndSwap(false, true) {
		return ErrDone
	}
	defer l.cn.unref()
	l.cn.addOrphans(1)
	if err := l.cn.pushLazy([]shm.SQE{{Op: shm.OpRelease, Token: l.token}}); err != nil {
		return fmt.Errorf("release %s: %w", l.Hash, err)
	}
	return nil
}

// ReserveBatch reserves slots for hashes with one doorbell. res[i] is nil
// when hashes[i] is already cached or being written (a duplicate put is a
// no-op) or when the tier was full for it, in which case err is ErrFull and
// the other reservations are still valid.
func (s *Session) ReserveBatch(ctx context.Context, hashes []Hash) ([]*Reservation, error) {
	return s.reserveBatch(ctx, hashes, 0)
}

func (s *Session) reserveBatch(ctx context.Context, hashes []Hash, flags uint8) ([]*Reservation, error) {
	cn, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	// Hold the mappings until each reservation holds its own reference:
	// if the connection dies meanwhile, the reaper drops the connection's
	// reference and cn.ref() below would revive an unmapped arena.
	if !cn.tryRef() {
		return nil, cn.errDead()
	}
	defer cn.unref()
	es := make([]shm.SQE, len(hashes))
	for i, h := range hashes {
		es[i] = shm.SQE{Op: shm.OpReserve, Flags: flags, Hash: h}
	}
	out := make([]shm.CQE, len(hashes))
	if err := cn.submit(ctx, es, out); err != nil {
		return nil, fmt.Errorf("reserve: %w", err)
	}
	res := make([]*Reservation, len(hashes))
	var full bool
	var firstErr error
	for i := range out {
		switch out[i].Status {
		case shm.StatusOK:
			r := &Reservation{Hash: hashes[i], cn: cn, token: out[i].Value, tier: out[i].Tier}
			if err := cn.place(&out[i], flags, &r.buf, &r.dptr); err != nil {
				cn.kill(err)
				for _, r := range res {
					if r != nil {
						cn.unref()
					}
				}
				return nil, err
			}
			cn.ref()
			res[i] = r
		case shm.StatusExists:
		case shm.StatusFull:
			full = true
		default:
			if firstErr == nil {
				firstErr = fmt.Errorf("reserve %s: %w", hashes[i], statusErr(out[i].Status))
			}
		}
	}
	if firstErr != nil {
		return res, firstErr
	}
	if full {
		return res, fmt.Errorf("reserve: %w", ErrFull)
	}
	return res, nil
}

// Reserve reserves a slot for one block. It returns (nil, nil) when the
// block is already cached or being written.
func (s *Session) Reserve(ctx context.Context, h Hash) (*Reservation, error) {
	rs, err := s.ReserveBatch(ctx, []Hash{h})
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// CommitBatch commits reservations with one doorbell.
func (s *Session) CommitBatch(ctx context.Context, rs []*Reservation) error {
	_, err := finishBatch(ctx, rs, shm.OpCommit)
	return err
}

// AbortBatch aborts reservations with one doorbell.
func (s *Session) AbortBatch(ctx context.Context, rs []*Reservation) error {
	_, err := finishBatch(ctx, rs, shm.OpAbort)
	return err
}

// finishBatch commits or aborts rs (nil entries skipped) and returns how
// many the daemon accepted.
func finishBatch(ctx context.Context, rs []*Reservation, op shm.Op) (int, error) {
	// Group by connection generation: reservations of a dead connection are
	// void and report ErrDisconnected.
	byConn := map[*conn][]*Reservation{}
	for i, r := range rs {
		if r == nil {
			continue
		}
		if !r.done.CompareAndSwap(false, true) {
			// Leave the others as they were: still the caller's to finish.
			for _, q := range rs[:i] {
				if q != nil {
					q.done.Store(false)
				}
			}
			return 0, fmt.Errorf("%s %s: %w", op, r.Hash, ErrDone)
		}
		byConn[r.cn] = append(byConn[r.cn], r)
	}
	var errs []error
	ok := 0
	for cn, group := range byConn {
		es := make([]shm.SQE, len(group))
		for i, r := range group {
			es[i] = shm.SQE{Op: op, Token: r.token}
		}
		out := make([]shm.CQE, len(group))
		err := cn.submit(ctx, es, out)
		for range group {
			cn.unref()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", op, err))
			continue
		}
		for i := range out {
			if e := statusErr(out[i].Status); e != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", op, group[i].Hash, e))
				continue
			}
			ok++
		}
	}
	return ok, errors.Join(errs...)
}

// AcquireBatch leases cached blocks with one doorbell; ls[i] is nil on a
// miss.
func (s *Session) AcquireBatch(ctx context.Context, hashes []Hash) ([]*Lease, error) {
	return s.acquireBatch(ctx, hashes, 0)
}

func (s *Session) acquireBatch(ctx context.Context, hashes []Hash, flags uint8) ([]*Lease, error) {
	cn, err := s.conn(ctx)
	if err != nil {
		return nil, err
	}
	// As in reserveBatch: the leases take their references under this one.
	if !cn.tryRef() {
		return nil, cn.errDead()
	}
	defer cn.unref()
	es := make([]shm.SQE, len(hashes))
	for i, h := range hashes {
		es[i] = shm.SQE{Op: shm.OpAcquire, Flags: flags, Hash: h}
	}
	out := make([]shm.CQE, len(hashes))
	if err := cn.submit(ctx, es, out); err != nil {
		return nil, fmt.Errorf("acquire: %w", err)
	}
	ls := make([]*Lease, len(hashes))
	for i := range out {
		switch out[i].Status {
		case shm.StatusOK:
			l := &Lease{Hash: hashes[i], Tier: out[i].Tier, Promoted: out[i].Flags&shm.CQEFlagPromoted != 0,
				cn: cn, token: out[i].Value}
			if err := cn.place(&out[i], flags, &l.buf, &l.dptr); err != nil {
				cn.kill(err)
				for _, l := range ls {
					if l != nil {
						cn.unref()
					}
				}
				return nil, err
			}
			cn.ref()
			ls[i] = l
		case shm.StatusNotFound:
		default:
			for _, l := range ls {
				if l != nil {
					l.Release()
				}
			}
			// Later entries may have been granted too: give them back.
			var undo []shm.SQE
			for j := i + 1; j < len(out); j++ {
				if u, ok := undoOf(shm.OpAcquire, &out[j]); ok {
					undo = append(undo, u)
				}
			}
			cn.pushAsync(undo)
			return nil, fmt.Errorf("acquire %s: %w", hashes[i], statusErr(out[i].Status))
		}
	}
	return ls, nil
}

// Acquire leases one cached block; ErrNotFound on a miss.
func (s *Session) Acquire(ctx context.Context, h Hash) (*Lease, error) {
	ls, err := s.AcquireBatch(ctx, []Hash{h})
	if err != nil {
		return nil, err
	}
	if ls[0] == nil {
		return nil, ErrNotFound
	}
	return ls[0], nil
}

// ReleaseBatch releases leases.
func (s *Session) ReleaseBatch(ls []*Lease) error {
	var errs []error
	for _, l := range ls {
		if l != nil {
			if err := l.Release(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// PutBatch copies blocks into the cache: reserve all, copy, commit all.
// It returns how many were stored; already-cached blocks are skipped.
func (s *Session) PutBatch(ctx context.Context, hashes []Hash, blocks [][]byte) (int, error) {
	if len(hashes) != len(blocks) {
		return 0, fmt.Errorf("put: %d hashes for %d blocks", len(hashes), len(blocks))
	}
	for _, b := range blocks {
		if uint64(len(b)) != s.ns.BlockBytes {
			return 0, fmt.Errorf("put: %w (%d, want %d)", ErrBlockSize, len(b), s.ns.BlockBytes)
		}
	}
	rs, err := s.ReserveBatch(ctx, hashes)
	if rs == nil {
		return 0, err
	}
	for i, r := range rs {
		if r != nil {
			copy(r.buf, blocks[i])
		}
	}
	// Commits the daemon accepted are stored even when others failed.
	stored, cerr := finishBatch(ctx, rs, shm.OpCommit)
	if cerr != nil {
		return stored, cerr
	}
	return stored, err
}

// Put copies one block into the cache. stored is false when it was already
// cached or is being written by another put (of another session, or an
// earlier call of this session that its context abandoned). That write may
// still be aborted: false is not a promise that a later Get hits.
func (s *Session) Put(ctx context.Context, h Hash, block []byte) (stored bool, err error) {
	n, err := s.PutBatch(ctx, []Hash{h}, [][]byte{block})
	return n == 1, err
}

// GetBatch copies cached blocks into dsts; found[i] reports a hit.
func (s *Session) GetBatch(ctx context.Context, hashes []Hash, dsts [][]byte) ([]bool, error) {
	if len(hashes) != len(dsts) {
		return nil, fmt.Errorf("get: %d hashes for %d buffers", len(hashes), len(dsts))
	}
	for _, b := range dsts {
		if uint64(len(b)) != s.ns.BlockBytes {
			return nil, fmt.Errorf("get: %w (%d, want %d)", ErrBlockSize, len(b), s.ns.BlockBytes)
		}
	}
	ls, err := s.AcquireBatch(ctx, hashes)
	if err != nil {
		return nil, err
	}
	found := make([]bool, len(hashes))
	for i, l := range ls {
		if l != nil {
			memcopy.ToHot(dsts[i], l.buf)
			found[i] = true
		}
	}
	return found, s.ReleaseBatch(ls)
}

// Get copies one cached block into dst; ErrNotFound on a miss.
func (s *Session) Get(ctx context.Context, h Hash, dst []byte) error {
	found, err := s.GetBatch(ctx, []Hash{h}, [][]byte{dst})
	if err != nil {
		return err
	}
	if !found[0] {
		return ErrNotFound
	}
	return nil
}

// DeleteBatch removes blocks (leased ones go when released) and returns how
// many were present.
func (s *Session) DeleteBatch(ctx context.Context, hashes []Hash) (int, error) {
	return s.deleteBatch(ctx, hashes, 0)
}

func (s *Session) deleteBatch(ctx context.Context, hashes []Hash, flags uint8) (int, error) {
	cn, err := s.conn(ctx)
	if err != nil {
		return 0, err
	}
	es := make([]shm.SQE, len(hashes))
	for i, h := range hashes {
		es[i] = shm.SQE{Op: shm.OpDelete, Flags: flags, Hash: h}
	}
	out := make([]shm.CQE, len(hashes))
	if err := cn.submit(ctx, es, out); err != nil {
		return 0, fmt.Errorf("delete: %w", err)
	}
	n := 0
	for i := range out {
		switch out[i].Status {
		case shm.StatusOK:
			n++
		case shm.StatusNotFound:
		default:
			return n, fmt.Errorf("delete %s: %w", hashes[i], statusErr(out[i].Status))
		}
	}
	return n, nil
}

// Delete removes one block; it reports whether it was present.
func (s *Session) Delete(ctx context.Context, h Hash) (bool, error) {
	n, err := s.DeleteBatch(ctx, []Hash{h})
	return n == 1, err
}

// LookupResult says how many leading blocks of a chain are cached and in
// which tier each of them is.
type LookupResult struct {
	Hits  int
	Tiers []Tier
}

// Lookup finds the longest cached prefix of chain in one round trip (more
// if the chain exceeds the session's data area).
func (s *Session) Lookup(ctx context.Context, chain []Hash) (LookupResult, error) {
	var res LookupResult
	if len(chain) == 0 {
		return res, nil
	}
	cn, err := s.conn(ctx)
	if err != nil {
		return res, err
	}
	per := cn.data.maxBytes() / (shm.LookupKeySize + 1)
	if per == 0 {
		return res, fmt.Errorf("lookup: %w: the session's data area holds no key", shm.ErrMalformed)
	}
	res.Tiers = make([]Tier, 0, len(chain))
	for len(chain) > 0 {
		part := chain[:min(len(chain), per)]
		chain = chain[len(part):]
		hits, err := cn.lookup(ctx, part, &res.Tiers)
		if err != nil {
			return LookupResult{}, fmt.Errorf("lookup: %w", err)
		}
		res.Hits += hits
		if hits < len(part) {
			break
		}
	}
	return res, nil
}

func (cn *conn) lookup(ctx context.Context, part []Hash, tiers *[]Tier) (int, error) {
	// The data area lies in the ring mapping: hold it.
	if !cn.tryRef() {
		return 0, cn.errDead()
	}
	defer cn.unref()
	n := len(part) * (shm.LookupKeySize + 1)
	off, err := cn.data.alloc(ctx, n)
	if errors.Is(err, errAreaDead) {
		return 0, cn.errDead()
	} else if err != nil {
		return 0, err
	}
	free := func() { cn.data.free(off, n) }
	buf := cn.ring.Data()[off : off+n]
	for i, h := range part {
		shm.EncodeHash(buf[i*shm.LookupKeySize:], h)
	}
	var out [1]shm.CQE
	e := []shm.SQE{{Op: shm.OpLookup, Count: uint32(len(part)), Buf: uint32(off), BufLen: uint32(n)}}
	// If ctx abandons the lookup, the daemon may still read the keys and
	// write the results: the pages are freed only once it has answered.
	if handedOff, err := cn.submitLate(ctx, e, out[:], free); err != nil {
		if !handedOff {
			free()
		}
		return 0, err
	}
	defer free()
	if err := statusErr(out[0].Status); err != nil {
		return 0, err
	}
	if out[0].Value > uint64(len(part)) {
		return 0, fmt.Errorf("%w: lookup of %d keys answered %d hits", shm.ErrMalformed, len(part), out[0].Value)
	}
	hits := int(out[0].Value)
	res := buf[len(part)*shm.LookupKeySize:]
	for i := 0; i < hits; i++ {
		*tiers = append(*tiers, Tier(res[i]))
	}
	return hits, nil
}

// Nop sends an empty request through the rings and waits for its
// completion: the bare round-trip cost, for benchmarks and health checks.
func (s *Session) Nop(ctx context.Context) error {
	cn, err := s.conn(ctx)
	if err != nil {
		return err
	}
	var out [1]shm.CQE
	return cn.submit(ctx, []shm.SQE{{Op: shm.OpNop}}, out[:])
}

// parkHashes names the blocks of a parked request: they are addressed by
// request id and index, not by prefix.
func parkHashes(requestID uint64, n int) []Hash {
	hs := make([]Hash, n)
	for i := range hs {
		hs[i] = Hash{Hi: requestID, Lo: uint64(i)}
	}
	return hs
}

// ErrParked: Park of a request id that is already parked.
var ErrParked = errors.New("kvtier: request already parked")

// Park swaps out the KV blocks of a paused request under requestID, in one
// batched call. Parked blocks are private to the request (no prefix
// sharing): only Resume and Unpark with the same id reach them. The daemon
// writes them through to NVMe and drops them from host memory; they are kept
// until resumed, unparked or the daemon's park TTL, and never dropped for
// space while the disk has room. Blocks the disk has no room for stay in
// host memory, held for a retry up to half the host tier and evictable
// beyond it (kvtier_errors_total{kind="park"} counts them). Parked blocks may hold at most the
// daemon's nvme.parked_share of the disk tier: past it Park fails with ErrFull and the engine
// recomputes the request when it resumes it instead. A Park that fails parks nothing (with
// ErrParked, the request parked before stays as it was); the drops of what
// it committed precede the session's next entries, so a retry at once is
// safe. One exception: if the connection ended after some commits landed,
// the daemon keeps those blocks (a retry reports ErrParked; Unpark drops
// them).
//
// Request ids are those of the namespace, not of the session: any session
// of the same namespace, in this process or another (another replica of
// the same model), reaches a request by its id, which is what lets one
// engine process resume a request another parked. Processes that must
// not reach each other's requests take ids that cannot collide (random
// 64-bit ids, or a replica number in the high bits).
func (s *Session) Park(ctx context.Context, requestID uint64, blocks [][]byte) error {
	for _, b := range blocks {
		if uint64(len(b)) != s.ns.BlockBytes {
			return fmt.Errorf("park: %w (%d, want %d)", ErrBlockSize, len(b), s.ns.BlockBytes)
		}
	}
	rs, err := s.reserveBatch(ctx, parkHashes(requestID, len(blocks)), shm.SQEFlagParked)
	if rs == nil {
		return fmt.Errorf("park request %d: %w", requestID, err)
	}
	for i, r := range rs {
		if r == nil && err == nil {
			err = ErrParked
		}
		if r != nil {
			copy(r.buf, blocks[i])
		}
	}
	if err != nil {
		s.AbortBatch(ctx, rs)
		return fmt.Errorf("park request %d: %w", requestID, err)
	}
	if err := s.CommitBatch(ctx, rs); err != nil {
		// Some commits may have landed: drop the request's blocks, so that
		// a failed Park leaves nothing parked (a retry would find it
		// ErrParked, a Resume ErrNotFound). The ring keeps the order: a
		// commit still on its way lands before these deletes, and they
		// land before the session's next entries (a retry of this Park),
		// queued like releases and answered by no one.
		es := make([]shm.SQE, len(rs))
		for i, h := range parkHashes(requestID, len(rs)) {
			es[i] = shm.SQE{Op: shm.OpDelete, Flags: shm.SQEFlagParked, Hash: h}
		}
		for _, r := range rs {
			if r == nil {
				continue
			}
			// A dead connection cannot carry them (see the doc comment).
			if cn := r.cn; cn.tryRef() {
				cn.addOrphans(len(es))
				if cn.pushLazy(es) != nil {
					cn.addOrphans(-len(es))
				}
				cn.unref()
			}
			break
		}
		return fmt.Errorf("park request %d: %w", requestID, err)
	}
	return nil
}

// Resume copies the blocks of a parked request back into dsts (one batched
// call; blocks swapped out to NVMe are promoted first) and releases them.
// ErrNotFound if any block is gone (TTL, or never parked); ErrFull if the
// host tier has no room to bring them up now (retry later). In either case
// nothing is released. Once the blocks are copied, Resume does not wait
// for their release: it returns nil even if ctx ends meanwhile.
func (s *Session) Resume(ctx context.Context, requestID uint64, dsts [][]byte) error {
	for _, b := range dsts {
		if uint64(len(b)) != s.ns.BlockBytes {
			return fmt.Errorf("resume: %w (%d, want %d)", ErrBlockSize, len(b), s.ns.BlockBytes)
		}
	}
	hs := parkHashes(requestID, len(dsts))
	ls, err := s.acquireBatch(ctx, hs, shm.SQEFlagParked)
	if err != nil {
		return fmt.Errorf("resume request %d: %w", requestID, err)
	}
	missing := 0
	var cn *conn
	for i, l := range ls {
		if l == nil {
			missing++
			continue
		}
		memcopy.ToHot(dsts[i], l.buf)
		cn = l.cn
	}
	// The deletes below need the ring mapped after the leases let go
	// (while one holds its reference, ref cannot be the first).
	if cn != nil {
		cn.ref()
		defer cn.unref()
	}
	if err := s.ReleaseBatch(ls); err != nil {
		return fmt.Errorf("resume request %d: %w", requestID, err)
	}
	if missing > 0 {
		return fmt.Errorf("resume request %d: %d of %d blocks: %w", requestID, missing, len(dsts), ErrNotFound)
	}
	if cn == nil {
		return nil // no block
	}
	// The blocks are the caller's now: the parked copies are dropped by
	// deletes queued behind the releases, answered by no one, so that
	// ctx ending meanwhile cannot turn a resume whose blocks were copied
	// into an error (the engine would recompute the request, and the
	// blocks would stay parked for the TTL). In ring order: a Park of the
	// same id that follows finds them gone.
	es := make([]shm.SQE, len(hs))
	for i, h := range hs {
		es[i] = shm.SQE{Op: shm.OpDelete, Flags: shm.SQEFlagParked, Hash: h}
	}
	cn.addOrphans(len(es))
	if err := cn.pushLazy(es); err != nil {
		cn.addOrphans(-len(es))
		return fmt.Errorf("resume request %d: blocks copied, but the parked copies could not be dropped (they stay for the park TTL; Unpark drops them): %w", requestID, err)
	}
	return nil
}

// Unpark drops the n blocks of a parked request without reading them and
// returns how many were there.
func (s *Session) Unpark(ctx context.Context, requestID uint64, n int) (int, error) {
	if n < 0 {
		return 0, fmt.Errorf("unpark request %d: %d blocks", requestID, n)
	}
	return s.deleteBatch(ctx, parkHashes(requestID, n), shm.SQEFlagParked)
}
