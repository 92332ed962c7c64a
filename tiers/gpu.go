package tiers

// The GPU tier: one daemon-owned device arena per GPU, exported once through
// CUDA IPC, on top of the host → nvme chain.
//
// Slots in a GPU arena are managed by the host tier's slab allocator (a Host
// built with NewSlots): the allocator never touches device memory except to
// compact, which it does through a synchronous device-to-device Move on a
// stream of its own, under its lock, and only for unpinned blocks (never a
// leased or reserved one). The GPU allocator does not evict (NoEvict):
// capacity pressure is relieved by demotion to the host tier instead, by a
// demoter per GPU that copies the coldest unleased blocks device → pinned host
// arena and then drops them from the GPU.
//
// A block may have copies in several tiers (a GPU and the host tier after a
// promotion, or host and NVMe); blocks are immutable, so every copy is equal.
// Reservations of new blocks go through GPUSet.Reserve, which checks every
// tier under one lock, so a key is never reserved twice. Copies made by the
// daemon (demotion, promotion, migration, GPU → host for a host-only reader)
// run on mover goroutines: queued on a stream, an event recorded after the
// copy and waited for, never a device-wide synchronize; the ring loops never
// wait for them (deferred completions, as for NVMe promotions).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/policy"
)

// GPUConfig tunes the GPU tier.
type GPUConfig struct {
	SlabBytes int64 // slab size of the GPU arenas (the arena is rounded down to a multiple)
	Align     int64 // slot alignment (default DefaultAlign)
	// HighWatermark and LowWatermark are fractions of each GPU arena: above
	// high its demoter moves the coldest blocks to the host tier until low.
	HighWatermark, LowWatermark float64
	// Workers run the daemon-side copies (default 4); Streams per GPU
	// (default Workers).
	Workers int
	Logger  *slog.Logger
}

// GPU is one device's arena and its allocator.
type GPU struct {
	Index  int
	Dev    cudaipc.Device
	Arena  cudaipc.Arena
	Handle cudaipc.IPCHandle
	Slots  *Host

	set     *GPUSet
	demoted atomic.Uint64 // blocks demoted from this GPU to the host tier
	// fallbacks counts device reads of host blocks served from the host
	// tier because this arena had no room for their promotion.
	fallbacks atomic.Uint64
	// passes counts the demoter's passes (tests wait on it).
	passes  atomic.Uint64
	compact cudaipc.Stream
	copiers chan *gpuCopier
	kick    chan struct{}
	// pressure: a reservation found the arena at its high watermark and
	// fell back to the host tier; the demoter then runs down to the low
	// watermark even though the arena is not above the high one (else the
	// oldest blocks would hold the GPU forever and every new one go to the
	// host tier).
	pressure atomic.Bool
}

type gpuCopier struct {
	s cudaipc.Stream
	e cudaipc.Event
}

func (g *GPU) ptr(off int64) cudaipc.DevicePtr { return g.Arena.Ptr() + cudaipc.DevicePtr(off) }

// run queues one copy on a stream of g and waits for an event recorded after
// it (the copy's completion, not the device's).
func (g *GPU) run(op func(s cudaipc.Stream) error) error {
	c := <-g.copiers
	defer func() { g.copiers <- c }()
	if err := op(c.s); err != nil {
		return err
	}
	if err := c.e.Record(c.s); err != nil {
		c.s.Synchronize()
		return err
	}
	return c.e.Synchronize()
}

// fits reports whether a block of size bytes fits in a slot of g's arena
// at all: a larger one (a namespace's blocks over gpu.slab_bytes) is never
// on this GPU, and making room for it would demote other blocks for nothing.
func (g *GPU) fits(size int64) bool { return size <= g.Slots.slabBytes }

// hasRoom reports whether n more bytes stay under the high watermark.
func (g *GPU) hasRoom(n int64) bool {
	used, capacity := g.Slots.Occupied() // the slabs' waste too (Host.Occupied)
	return float64(used+n) <= g.set.cfg.HighWatermark*float64(capacity)
}

func (g *GPU) kickDemoter() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// makeRoom asks the demoter (never waiting for it) to bring the arena down
// to its low watermark, so that later reservations find room on the GPU.
func (g *GPU) makeRoom() {
	g.pressure.Store(true)
	g.kickDemoter()
}

// GPUSet is the GPU tier of every device, over the chain.
type GPUSet struct {
	Chain *Chain
	GPUs  []*GPU
	cfg   GPUConfig
	log   *slog.Logger
	host  []byte // the host arena, registered as pinned
	reg   cudaipc.Device

	mu sync.Mutex // serializes reservations of new blocks across tiers

	imu      sync.Mutex
	inflight map[moveKey]*gpuMove
	jobs     chan func()
	wg       sync.WaitGroup
	// stopped (imu): Wait ran; moves fail at once. handoffs counts the
	// goroutines handing a job to a full queue, which Wait drains.
	stopped  bool
	handoffs sync.WaitGroup

	promoted, demoted, migrated, toHost atomic.Uint64
	copyErrors, compactErrors           atomic.Uint64
	// Per direction: host → gpu, gpu → host, gpu → gpu.
	up, down, peer moveCounters

	// moving holds a token per daemon-side copy in flight per key; Delete
	// marks them, and a copy whose token is marked aborts its reservation
	// instead of committing (so a Delete racing with a copy wins).
	tmu    sync.Mutex
	moving map[Key][]*moveTok

	copied func(k Key) // tests: called after a copy, before its commit
}

// moveTok is a copy in flight: deleted once a Delete marked it; res is its
// destination reservation, once made (tmu).
type moveTok struct {
	deleted bool
	res     *Handle
}

// moveCounters count the copies of one direction.
type moveCounters struct {
	blocks, bytes, errors atomic.Uint64
	nanos                 atomic.Int64
}

func (m *moveCounters) done(n int64, start time.Time) {
	m.blocks.Add(1)
	m.bytes.Add(uint64(n))
	m.nanos.Add(int64(time.Since(start)))
}

// MoveStats counts the copies of one direction.
type MoveStats struct {
	Blocks, Bytes, Errors uint64
	Time                  time.Duration
}

func (m *moveCounters) stats() MoveStats {
	return MoveStats{Blocks: m.blocks.Load(), Bytes: m.bytes.Load(), Errors: m.errors.Load(), Time: time.Duration(m.nanos.Load())}
}

// track registers a copy of k in flight; untrack ends it.
func (gs *GPUSet) track(k Key) *moveTok {
	t := &moveTok{}
	gs.tmu.Lock()
	gs.moving[k] = append(gs.moving[k], t)
	gs.tmu.Unlock()
	return t
}

func (gs *GPUSet) untrack(k Key, t *moveTok) {
	gs.tmu.Lock()
	defer gs.tmu.Unlock()
	ts := gs.moving[k]
	for i, x := range ts {
		if x == t {
			ts = append(ts[:i], ts[i+1:]...)
			break
		}
	}
	if len(ts) == 0 {
		delete(gs.moving, k)
	} else {
		gs.moving[k] = ts
	}
}

// reserved records hd as the destination reservation of the copy t. The
// reservation of a copy whose block was deleted is disowned (tombstone), as
// it will be aborted: a put of the key after the Delete must not find it
// and be answered ErrExists.
func (gs *GPUSet) reserved(t *moveTok, hd *Handle) {
	gs.tmu.Lock()
	defer gs.tmu.Unlock()
	t.res = hd
	if t.deleted {
		hd.Owner().Disown(hd)
	}
}

// tombstone marks the copies of k in flight as deleted (and disowns their
// destination reservations: see reserved). Delete and
// DeleteNS call it and sweep the tiers under tmu, so that no copy starts
// (track) or commits (commitCopy) in between: a copy either commits before
// and is deleted by the sweep, is marked and aborts, or starts after the
// sweep and finds its source gone. tmu held.
func (gs *GPUSet) tombstone(match func(Key) bool) {
	for k, ts := range gs.moving {
		if match(k) {
			for _, t := range ts {
				t.deleted = true
				if t.res != nil {
					t.res.Owner().Disown(t.res)
				}
			}
		}
	}
}

// errDeleted: the block was deleted while it was being copied.
var errDeleted = errors.New("deleted during the copy")

// errHostBusy: the host tier holds the block only reserved (being written);
// a demotion keeps the GPU copy and tries again later.
var errHostBusy = errors.New("its host copy is still being written")

// commitCopy commits the destination reservation of a copy unless k was
// deleted since the copy began (then it aborts it and returns errDeleted).
// With pinned the committed block stays pinned (Host.CommitPinned).
func (gs *GPUSet) commitCopy(t *moveTok, h *Host, hd *Handle, pinned bool) error {
	if gs.copied != nil {
		gs.copied(hd.Key)
	}
	// Under mu: Reserve scans the tiers one after another, and a copy that
	// commits k in a tier it already scanned and drops the source from one
	// it has yet to scan (a migration) would hide k from it. tmu first: a
	// Delete holds tmu through its NVMe step, and a commit waiting for it
	// must not hold mu meanwhile (Reserve, on the ring loops, would wait
	// too). Nothing takes tmu under mu.
	gs.tmu.Lock()
	defer gs.tmu.Unlock()
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if t.deleted {
		h.Abort(hd)
		return fmt.Errorf("%w: %s %w", ErrGPUCopy, hd.Key.Hash, errDeleted)
	}
	if pinned {
		return h.CommitPinned(hd)
	}
	return h.Commit(hd)
}

type moveKey struct {
	k   Key
	dst *Host
}

type gpuMove struct {
	waiters []func(*Handle, error)
	// noRoom: a promotion to this GPU found no room and serves its
	// waiters from the host tier; each is a promotion fallback (set by
	// the work, read by its job).
	noRoom *GPU
}

// ErrGPUCopy reports a failed daemon-side device copy.
var ErrGPUCopy = errors.New("gpu copy failed")

// NewGPUSet allocates an arena of sizes[i] bytes (rounded down to the slab
// size) on each device, exports it, and registers hostArena (the mapped host
// arena, memory Go does not manage) as pinned, once (portable registration).
// On error everything allocated is released; the devices stay open.
func NewGPUSet(chain *Chain, hostArena []byte, devs []cudaipc.Device, sizes []int64, cfg GPUConfig) (gs *GPUSet, err error) {
	if len(devs) == 0 || len(devs) != len(sizes) {
		return nil, fmt.Errorf("tiers: gpu set: %d devices, %d sizes", len(devs), len(sizes))
	}
	if cfg.HighWatermark <= 0 || cfg.HighWatermark > 1 {
		cfg.HighWatermark = 0.9
	}
	if cfg.LowWatermark <= 0 || cfg.LowWatermark >= cfg.HighWatermark {
		cfg.LowWatermark = cfg.HighWatermark * 0.85
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Align == 0 {
		cfg.Align = DefaultAlign
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	gs = &GPUSet{Chain: chain, cfg: cfg, log: cfg.Logger, host: hostArena,
		inflight: map[moveKey]*gpuMove{}, moving: map[Key][]*moveTok{}, jobs: make(chan func(), 1024)}
	defer func() {
		if err != nil {
			gs.Close()
			gs = nil
		}
	}()
	for i, dev := range devs {
		size := sizes[i] / cfg.SlabBytes * cfg.SlabBytes
		if size <= 0 {
			return gs, fmt.Errorf("gpu %d: arena of %d bytes is smaller than a slab (%d)", i, sizes[i], cfg.SlabBytes)
		}
		g := &GPU{Index: i, Dev: dev, set: gs, kick: make(chan struct{}, 1), copiers: make(chan *gpuCopier, cfg.Workers)}
		gs.GPUs = append(gs.GPUs, g)
		if g.Arena, err = dev.Alloc(size); err != nil {
			return gs, fmt.Errorf("gpu %d: allocate arena of %d bytes: %w", i, size, err)
		}
		if g.Handle, err = g.Arena.IPCHandle(); err != nil {
			return gs, fmt.Errorf("gpu %d: export arena: %w", i, err)
		}
		if g.compact, err = dev.NewStream(); err != nil {
			return gs, fmt.Errorf("gpu %d: %w", i, err)
		}
		for w := 0; w < cfg.Workers; w++ {
			c := &gpuCopier{}
			if c.s, err = dev.NewStream(); err != nil {
				return gs, fmt.Errorf("gpu %d: %w", i, err)
			}
			if c.e, err = dev.NewEvent(); err != nil {
				c.s.Close()
				return gs, fmt.Errorf("gpu %d: %w", i, err)
			}
			g.copiers <- c
		}
		g.Slots, err = NewSlots(size, HostConfig{SlabBytes: cfg.SlabBytes, Align: cfg.Align, NoEvict: true, Move: g.move})
		if err != nil {
			return gs, fmt.Errorf("gpu %d: %w", i, err)
		}
	}
	if err = devs[0].RegisterHost(hostArena); err != nil {
		return gs, fmt.Errorf("register host arena as pinned: %w", err)
	}
	gs.reg = devs[0]
	return gs, nil
}

// move is the GPU allocator's compaction hook: a synchronous D2D copy on
// the compaction stream (called under the allocator's lock). On error the
// allocator drops the block.
func (g *GPU) move(dst, src, n int64) error {
	err := g.Dev.CopyDtoDAsync(g.ptr(dst), g.ptr(src), n, g.compact)
	if err == nil {
		err = g.compact.Synchronize()
	}
	if err != nil {
		g.set.compactErrors.Add(1)
		g.set.log.Error("gpu arena compaction copy failed; block dropped", "gpu", g.Index, "err", err)
	}
	return err
}

// ByUUID returns the index of the GPU with uuid.
func (gs *GPUSet) ByUUID(u cudaipc.UUID) (int, bool) {
	for i, g := range gs.GPUs {
		if g.Dev.Info().UUID == u {
			return i, true
		}
	}
	return -1, false
}

// Start runs the copy workers and the demoters until ctx ends.
func (gs *GPUSet) Start(ctx context.Context) {
	gs.wg.Add(gs.cfg.Workers + len(gs.GPUs))
	for i := 0; i < gs.cfg.Workers; i++ {
		go func() {
			defer gs.wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case f := <-gs.jobs:
					f()
				}
			}
		}()
	}
	for _, g := range gs.GPUs {
		go func() {
			defer gs.wg.Done()
			gs.demoteLoop(ctx, g)
		}()
	}
}

// Wait waits for Start's goroutines and runs the copies still queued, so
// that every waiter is answered.
func (gs *GPUSet) Wait() {
	gs.wg.Wait()
	gs.imu.Lock()
	gs.stopped = true
	gs.imu.Unlock()
	handed := make(chan struct{})
	go func() { gs.handoffs.Wait(); close(handed) }()
	for {
		select {
		case f := <-gs.jobs:
			f()
		case <-handed:
			for {
				select {
				case f := <-gs.jobs:
					f()
				default:
					return
				}
			}
		}
	}
}

// Close frees the arenas (after the copies in flight), unregisters the host
// arena and closes the devices. Clients must have closed their mappings.
func (gs *GPUSet) Close() {
	for _, g := range gs.GPUs {
		for len(g.copiers) > 0 {
			c := <-g.copiers
			c.e.Close()
			c.s.Close()
		}
		if g.compact != nil {
			g.compact.Close()
		}
		if g.Arena != nil {
			g.Arena.Free()
		}
	}
	if gs.reg != nil {
		gs.reg.UnregisterHost(gs.host)
		gs.reg = nil
	}
	for _, g := range gs.GPUs {
		g.Dev.Close()
	}
}

// holder returns the index of a GPU other than not that holds k committed.
func (gs *GPUSet) holder(k Key, not int) int {
	for i, g := range gs.GPUs {
		if i != not && g.Slots.Contains(k) {
			return i
		}
	}
	return -1
}

// Lookup is Chain.Lookup with the GPU tiers on top: a key in any GPU arena
// is a hit reported as shm.TierGPU.
func (gs *GPUSet) Lookup(keys []Key, out []shm.Tier) (hits int, req uint64) {
	type gpuHit struct{ i, gpu int }
	var found []gpuHit
	hits, req = gs.Chain.lookup(keys, out, func(i int) bool {
		j := gs.holder(keys[i], -1)
		if j < 0 {
			return false
		}
		out[i] = shm.TierGPU
		found = append(found, gpuHit{i, j})
		return true
	})
	// A lookup announces reads: the GPU blocks found become their arena's
	// most recent (the demoter takes the coldest), touched from the
	// chain's end back so that its head ends up most recent, as in the
	// host tier.
	var t [1]shm.Tier
	for x := len(found) - 1; x >= 0; x-- {
		h := found[x]
		gs.GPUs[h.gpu].Slots.Lookup(keys[h.i:h.i+1], t[:])
	}
	return hits, req
}

// Reserve reserves a slot for a new block: in GPU gpu's arena when gpu >= 0
// and it has room, else in the host tier. A block present in any tier is
// ErrExists. Parked blocks always go to the host tier. A device reservation
// that finds the GPU at its high watermark kicks its demoter (without
// waiting) to move the coldest blocks to the host tier down to the low
// watermark, so that the GPU keeps the most recent blocks.
func (gs *GPUSet) Reserve(k Key, size int64, gpu int) (*Handle, error) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	for _, g := range gs.GPUs {
		if g.Slots.Present(k) {
			return nil, ErrExists
		}
	}
	if gpu >= 0 && gpu < len(gs.GPUs) && !k.Parked() && gs.GPUs[gpu].fits(size) {
		g := gs.GPUs[gpu]
		// A host reservation of a promotion whose block was deleted since
		// is given up, as Chain.Reserve does: it will never be committed,
		// and this put is not a duplicate.
		if gs.Chain.inNVMe(k) || (gs.Chain.Host.Present(k) && !gs.Chain.disownDeletedPromotion(k)) {
			return nil, ErrExists
		}
		if g.hasRoom(size) {
			hd, err := g.Slots.Reserve(k, size)
			if err == nil {
				return hd, nil
			}
			if !errors.Is(err, ErrFull) && !errors.Is(err, ErrTooLarge) {
				return nil, err
			}
		}
		g.makeRoom()
	}
	return gs.Chain.Reserve(k, size)
}

// GPUOf returns the GPU whose allocator owns hd, or nil for a host handle.
func (gs *GPUSet) GPUOf(hd *Handle) *GPU {
	for _, g := range gs.GPUs {
		if hd.host == g.Slots {
			return g
		}
	}
	return nil
}

// Committed is called after a GPU reservation was committed.
func (gs *GPUSet) Committed(g *GPU) {
	if used, capacity := g.Slots.Occupied(); float64(used) > gs.cfg.HighWatermark*float64(capacity) {
		g.kickDemoter()
	}
}

// Acquire leases k for a reader on GPU gpu (-1: none). device says the
// reader can take a slot in that GPU's arena; otherwise (or without a GPU)
// the lease is in the host tier. As Chain.Acquire, (nil, true) means done
// will be called from a mover goroutine with the lease or an error, and
// (nil, false) is a miss.
//
// A device reader gets: its GPU's copy; else a copy migrated from another
// GPU by a peer copy (when peer access exists and its arena has room), or
// through the host tier; else a promotion host → its GPU (when it has room);
// else whatever the chain gives (host, or a promotion from NVMe).
func (gs *GPUSet) Acquire(k Key, size int64, gpu int, device bool, done func(*Handle, error)) (*Handle, bool) {
	host := gs.Chain.Host
	if device && gpu >= 0 && gpu < len(gs.GPUs) && !k.Parked() {
		g := gs.GPUs[gpu]
		if hd, ok := g.Slots.Acquire(k); ok {
			return hd, true
		}
		if j := gs.holder(k, gpu); j >= 0 {
			src := gs.GPUs[j]
			if peer, err := src.Dev.CanAccessPeer(g.Dev); err == nil && peer {
				if g.hasRoom(size) {
					gs.startMove(k, g.Slots, servedBy(src.Slots, done), func(*gpuMove) (*Host, *Handle, error) { return gs.migrate(src, g, k, size) })
					return nil, true
				}
				g.makeRoom() // so that the next read migrates
			}
			if hd, ok := host.Acquire(k); ok {
				return hd, true
			}
			gs.startMove(k, host, servedBy(src.Slots, done), func(*gpuMove) (*Host, *Handle, error) { return gs.viaHost(src, k, size) })
			return nil, true
		}
		if g.fits(size) && host.Contains(k) {
			if g.hasRoom(size) {
				// Pinned here, not by the mover: a host copy demoted
				// (and dropped) while the promotion waited in the queue
				// would fail the read of a block still cached in NVMe.
				if src, ok := host.Pin(k); ok {
					// Served by the host tier, through the promotion: a
					// host hit once served.
					if !gs.startMove(k, g.Slots, servedBy(host, done), func(m *gpuMove) (*Host, *Handle, error) { return gs.promote(g, k, src, m) }) {
						host.Unpin(src, false) // joined a move in flight, or stopped
					}
					return nil, true
				}
			} else {
				// The arena is full: serve the host copy now (an H2D
				// read costs the reader no more than the promotion
				// would) and kick the demoter, which moves the coldest
				// unleased GPU blocks down so that the next device read
				// promotes. Waiting for it instead would hold this
				// reader behind demotion copies.
				g.fallbacks.Add(1)
				g.makeRoom()
			}
		}
		return gs.Chain.Acquire(k, size, done)
	}
	if hd, ok := host.Acquire(k); ok {
		return hd, true
	}
	if j := gs.holder(k, -1); j >= 0 {
		src := gs.GPUs[j]
		gs.startMove(k, host, servedBy(src.Slots, done), func(*gpuMove) (*Host, *Handle, error) { return gs.viaHost(src, k, size) })
		return nil, true
	}
	return gs.Chain.acquireBelow(k, size, done) // the host miss is counted above
}

// servedBy wraps the completion of a get served by a copy from tier h for
// a reader elsewhere (a GPU's copy for the host tier or another GPU; a host
// copy promoted to a GPU): it counts a hit of h once the get is served, as
// an NVMe hit is counted once its promotion is done; a copy that fails
// counts none.
func servedBy(h *Host, done func(*Handle, error)) func(*Handle, error) {
	return func(hd *Handle, err error) {
		if err == nil {
			h.countHit()
		}
		if done != nil {
			done(hd, err)
		}
	}
}

// startMove runs work on a mover goroutine, once per (key, destination);
// every waiter then gets a lease on the tier work reports the block in. When
// work also returns a pin on the block there (held), the block cannot leave
// that tier (a demoter picking the fresh, still unleased copy) before every
// waiter holds its lease; the pin is dropped after. It reports whether work
// will run (not when done joined a move in flight, or the tier is stopped).
// work gets the move, to note on it what its waiters count (noRoom).
func (gs *GPUSet) startMove(k Key, dst *Host, done func(*Handle, error), work func(m *gpuMove) (at *Host, held *Handle, err error)) bool {
	mk := moveKey{k: k, dst: dst}
	gs.imu.Lock()
	if gs.stopped {
		gs.imu.Unlock()
		if done != nil {
			go done(nil, fmt.Errorf("%w: %s: the GPU tier is stopped", ErrGPUCopy, k.Hash))
		}
		return false
	}
	if m := gs.inflight[mk]; m != nil {
		m.waiters = append(m.waiters, done)
		gs.imu.Unlock()
		return false
	}
	m := &gpuMove{waiters: []func(*Handle, error){done}}
	gs.inflight[mk] = m
	defer gs.imu.Unlock() // held to the handoff: Wait sees every job
	job := func() {
		at, held, err := work(m)
		gs.imu.Lock()
		delete(gs.inflight, mk)
		ws := m.waiters
		gs.imu.Unlock()
		for _, w := range ws {
			if err != nil {
				w(nil, err)
				continue
			}
			if hd, ok := at.Pin(k); ok {
				if m.noRoom != nil {
					m.noRoom.fallbacks.Add(1) // per read served from the host tier
				}
				w(hd, nil)
			} else {
				w(nil, fmt.Errorf("%w: %s left the tier before it was leased", ErrGPUCopy, k.Hash))
			}
		}
		if held != nil {
			at.Unpin(held, false)
		}
	}
	select {
	case gs.jobs <- job:
	default:
		gs.handoffs.Add(1)
		go func() { // bounded by the sessions' rings
			defer gs.handoffs.Done()
			gs.jobs <- job
		}()
	}
	return true
}

// promote copies k host → GPU g (H2D from the pinned host arena) from src,
// the host copy the caller pinned. The host copy stays (clean). It returns
// the tier to serve the waiters from with a pin on the block there (see
// startMove): GPU g's new copy, or the host copy when there is no room
// (noted on m, whose waiters then count a fallback each; the demoter is
// kicked) or the copy failed.
func (gs *GPUSet) promote(g *GPU, k Key, src *Handle, m *gpuMove) (*Host, *Handle, error) {
	host := gs.Chain.Host
	tok := gs.track(k)
	defer gs.untrack(k, tok)
	start := time.Now()
	// Deleted before the copy was tracked: Delete's tombstone pass missed
	// it (a Delete after track marks tok instead).
	if host.Deleted(src) {
		host.Unpin(src, false)
		return nil, nil, fmt.Errorf("%w: %s %w", ErrGPUCopy, k.Hash, errDeleted)
	}
	// src stays pinned until the waiters are served from it, or until the
	// GPU copy (pinned too) replaces it.
	dst, err := g.Slots.Reserve(k, src.Size)
	if err == nil {
		gs.reserved(tok, dst)
	}
	switch {
	case errors.Is(err, ErrExists):
		// Promoted meanwhile; or being put to the GPU: serve the host copy.
		if hd, ok := g.Slots.Pin(k); ok {
			host.Unpin(src, false)
			return g.Slots, hd, nil
		}
		return host, src, nil
	case err != nil:
		m.noRoom = g
		g.makeRoom()          // so the next promotion finds room
		return host, src, nil // no room after all: serve the host copy
	}
	err = g.run(func(s cudaipc.Stream) error { return g.Dev.CopyHtoDAsync(g.ptr(dst.Offset), host.Bytes(src), s) })
	if err != nil {
		g.Slots.Abort(dst)
		gs.copyErrors.Add(1)
		gs.up.errors.Add(1)
		gs.log.Warn("promotion host → gpu failed; serving the host copy", "gpu", g.Index, "err", err)
		return host, src, nil
	}
	if err := gs.commitCopy(tok, g.Slots, dst, true); err != nil {
		if errors.Is(err, errDeleted) {
			host.Unpin(src, false)
			return nil, nil, err
		}
		return host, src, nil
	}
	host.Unpin(src, false)
	gs.up.done(dst.Size, start)
	gs.promoted.Add(1)
	gs.Committed(g)
	return g.Slots, dst, nil
}

// migrate moves k from GPU src to GPU dst by a peer copy; the source copy is
// dropped unless a reader holds it. Without room it goes through the host.
// A successful migration returns dst's copy pinned (see startMove).
func (gs *GPUSet) migrate(src, dst *GPU, k Key, size int64) (*Host, *Handle, error) {
	tok := gs.track(k)
	defer gs.untrack(k, tok)
	start := time.Now()
	from, ok := src.Slots.Pin(k)
	if !ok {
		if hd, ok := dst.Slots.Pin(k); ok {
			return dst.Slots, hd, nil
		}
		return gs.viaHostAny(k, size)
	}
	to, err := dst.Slots.Reserve(k, from.Size)
	if err == nil {
		gs.reserved(tok, to)
	}
	if errors.Is(err, ErrExists) {
		src.Slots.Unpin(from, false)
		if hd, ok := dst.Slots.Pin(k); ok {
			return dst.Slots, hd, nil
		}
		return gs.viaHostAny(k, size)
	}
	if err != nil {
		src.Slots.Unpin(from, false)
		return gs.viaHost(src, k, size)
	}
	err = src.run(func(s cudaipc.Stream) error {
		return src.Dev.CopyPeerAsync(dst.ptr(to.Offset), dst.Dev, src.ptr(from.Offset), from.Size, s)
	})
	if err != nil {
		dst.Slots.Abort(to)
		src.Slots.Unpin(from, false)
		gs.copyErrors.Add(1)
		gs.peer.errors.Add(1)
		gs.log.Warn("peer copy failed; going through the host tier", "from", src.Index, "to", dst.Index, "err", err)
		return gs.viaHost(src, k, size)
	}
	if err := gs.commitCopy(tok, dst.Slots, to, true); err != nil {
		src.Slots.Unpin(from, false)
		if errors.Is(err, errDeleted) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%w: %v", ErrGPUCopy, err)
	}
	src.Slots.Unpin(from, true)
	gs.peer.done(to.Size, start)
	gs.migrated.Add(1)
	gs.Committed(dst)
	return dst.Slots, to, nil
}

// viaHostAny serves k through the host tier, copying it D2H from whichever
// GPU holds it; see viaHost.
func (gs *GPUSet) viaHostAny(k Key, size int64) (*Host, *Handle, error) {
	if j := gs.holder(k, -1); j >= 0 {
		return gs.viaHost(gs.GPUs[j], k, size)
	}
	if hd, ok := gs.Chain.Host.Pin(k); ok {
		return gs.Chain.Host, hd, nil
	}
	return nil, nil, fmt.Errorf("%w: %s is gone", ErrGPUCopy, k.Hash)
}

// viaHost makes sure the host tier holds k, copying it D2H from GPU g into
// the pinned host arena (the GPU copy stays), and returns the host copy
// pinned for startMove: committed unpinned, the host → NVMe mover could take
// the fresh copy before the waiters hold their leases, and a cached block
// would be answered as a miss.
func (gs *GPUSet) viaHost(g *GPU, k Key, size int64) (*Host, *Handle, error) {
	host := gs.Chain.Host
	src, ok := g.Slots.Pin(k)
	if !ok {
		if hd, ok := host.Pin(k); ok {
			return host, hd, nil
		}
		return nil, nil, fmt.Errorf("%w: %s left GPU %d before its copy", ErrGPUCopy, k.Hash, g.Index)
	}
	defer g.Slots.Unpin(src, false)
	// Another writer (the demoter, or a chain promotion) may hold k's host
	// slot reserved: wait for it to commit or abort (src stays pinned, so
	// the GPU copy outlives it), rather than answer an error for a block
	// that is cached.
	deadline := time.Now().Add(time.Second)
	for {
		held, err := gs.writeDown(g, src, true)
		if err != nil {
			return nil, nil, err
		}
		if held != nil {
			gs.toHost.Add(1)
			return host, held, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("%w: %s: %w", ErrGPUCopy, k.Hash, errHostBusy)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// writeDown copies the pinned GPU block hd into the host tier (a no-op when
// the host tier already holds it). With pin it returns the host copy pinned
// (nil when the host's copy is not committed yet: someone else is writing
// it); without, nil.
func (gs *GPUSet) writeDown(g *GPU, hd *Handle, pin bool) (*Handle, error) {
	c := gs.Chain
	tok := gs.track(hd.Key)
	defer gs.untrack(hd.Key, tok)
	if g.Slots.Deleted(hd) {
		return nil, fmt.Errorf("%w: %s %w", ErrGPUCopy, hd.Key.Hash, errDeleted)
	}
	start := time.Now()
	if c.NVMe != nil {
		c.makeRoom(hd.Size, 1, hd.Size) // demote host → nvme rather than drop
	}
	dst, err := c.Host.Reserve(hd.Key, hd.Size)
	if err == nil {
		gs.reserved(tok, dst)
	}
	if errors.Is(err, ErrExists) {
		if pin {
			if held, ok := c.Host.Pin(hd.Key); ok {
				return held, nil
			}
		} else if !c.Host.Contains(hd.Key) {
			// Only reserved there (a promotion from NVMe): if that
			// aborts, the GPU copy is the block's last one.
			return nil, errHostBusy
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reserve host slot: %v", ErrGPUCopy, err)
	}
	err = g.run(func(s cudaipc.Stream) error { return g.Dev.CopyDtoHAsync(c.Host.Bytes(dst), g.ptr(hd.Offset), s) })
	if err != nil {
		c.Host.Abort(dst)
		gs.copyErrors.Add(1)
		gs.down.errors.Add(1)
		return nil, fmt.Errorf("%w: gpu %d → host: %v", ErrGPUCopy, g.Index, err)
	}
	if err := gs.commitCopy(tok, c.Host, dst, pin); err != nil {
		if errors.Is(err, errDeleted) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrGPUCopy, err)
	}
	gs.down.done(dst.Size, start)
	if dst.Key.Parked() {
		c.Park(dst.Key)
	} else {
		c.Inserted(dst.Key, policy.AccessInfo{})
	}
	c.Committed()
	if pin {
		return dst, nil
	}
	return nil, nil
}

// Flush writes the blocks held only on a GPU down to the host tier, for a
// write-down at shutdown before Chain.Flush (which writes the host tier to
// NVMe): the GPU blocks are the hottest, and a restart must not lose them.
// Writing into the host tier makes room there by demoting host blocks to
// NVMe (writeDown), so a GPU tier larger than the host's still lands in
// NVMe. A block with a copy below already (host, or NVMe), one too large
// for NVMe, and one deleted meanwhile are skipped; leased blocks are copied
// (blocks are immutable) and stay on their GPU, as every block does. Each
// GPU's blocks go oldest first, so the hottest end up most recent in the
// host tier. Without an NVMe tier it does nothing. It returns how many
// blocks it wrote; ctx ends it early (the rest stays unwritten, and the
// error is ctx's), and copies that failed are reported in the error.
func (gs *GPUSet) Flush(ctx context.Context) (int, error) {
	c := gs.Chain
	if c.NVMe == nil {
		return 0, nil
	}
	var wrote, failed atomic.Int64
	var cut atomic.Bool
	var emu sync.Mutex
	var first error
	for _, g := range gs.GPUs {
		eachWriter(g.Slots.PinAllOldestFirst(), func(run []*Handle) {
			for _, hd := range run {
				switch {
				case ctx.Err() != nil:
					cut.Store(true)
				case c.Host.Present(hd.Key) || c.inNVMe(hd.Key) || c.tooLarge(hd):
				default:
					_, err := gs.writeDown(g, hd, false)
					switch {
					case err == nil:
						wrote.Add(1)
					case errors.Is(err, errDeleted) || errors.Is(err, errHostBusy):
					default:
						failed.Add(1)
						emu.Lock()
						if first == nil {
							first = err
						}
						emu.Unlock()
					}
				}
				g.Slots.Unpin(hd, false)
			}
		})
	}
	var err error
	if cut.Load() {
		err = ctx.Err()
	}
	if n := failed.Load(); n > 0 {
		err = errors.Join(err, fmt.Errorf("tiers: %d gpu blocks not written down, first: %w", n, first))
	}
	return int(wrote.Load()), err
}

// demoteLoop keeps GPU g under its high watermark by moving its coldest
// unleased blocks to the host tier; under pressure (a reservation that did
// not fit) it demotes down to the low watermark too.
func (gs *GPUSet) demoteLoop(ctx context.Context, g *GPU) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.kick:
		case <-t.C:
		}
		used, capacity := g.Slots.Occupied()
		pressed := g.pressure.Swap(false)
		if !pressed && float64(used) <= gs.cfg.HighWatermark*float64(capacity) {
			continue
		}
		for float64(used) > gs.cfg.LowWatermark*float64(capacity) && ctx.Err() == nil {
			moved, failed := gs.demoteBatch(g, 8)
			if moved == 0 {
				// The rest is leased (never moved) or failed to copy.
				// Room was asked for and leases end: try again at the
				// next tick, unless copies fail (no retry storm).
				if failed == 0 && pressed {
					g.pressure.Store(true)
				}
				break
			}
			used, _ = g.Slots.Occupied()
		}
		g.passes.Add(1)
	}
}

// demoteBatch moves up to n of GPU g's coldest unleased blocks to the host
// tier and returns how many left the GPU and how many copies failed.
func (gs *GPUSet) demoteBatch(g *GPU, n int) (moved, failed int) {
	// Blocks larger than a host slab (gpu.slab_bytes may exceed
	// host.slab_bytes) cannot go down: skipped, else the coldest of them
	// would take every batch and the demoter never free the GPU.
	hostSlab := gs.Chain.Host.slabBytes
	for _, hd := range g.Slots.pinColdest(n, func(hd *Handle) bool { return hd.Size > hostSlab }) {
		if _, err := gs.writeDown(g, hd, false); err != nil {
			if !errors.Is(err, errDeleted) && !errors.Is(err, errHostBusy) {
				failed++
				gs.log.Warn("demotion gpu → host failed", "gpu", g.Index, "err", err)
			}
			g.Slots.Unpin(hd, false)
			continue
		}
		if dropped, _ := g.Slots.Unpin(hd, true); dropped {
			moved++
			gs.demoted.Add(1)
			g.demoted.Add(1)
		}
	}
	return moved, failed
}

// Delete removes k from every GPU and the chain.
func (gs *GPUSet) Delete(k Key) bool {
	gs.tmu.Lock()
	defer gs.tmu.Unlock()
	gs.tombstone(func(x Key) bool { return x == k })
	found := false
	for _, g := range gs.GPUs {
		found = g.Slots.Delete(k) || found
	}
	return gs.Chain.Delete(k) || found
}

// Namespaces calls fn with the namespace of every block the GPU arenas
// and the chain hold or are moving, at least once each: the arenas first,
// as a block demoted meanwhile reaches the host tier before it leaves its
// arena. fn runs under the tiers' locks and must not call them.
func (gs *GPUSet) Namespaces(fn func(ns uint32)) {
	gs.tmu.Lock()
	for k := range gs.moving {
		fn(k.NS)
	}
	gs.tmu.Unlock()
	gs.imu.Lock()
	for mk := range gs.inflight {
		fn(mk.k.NS)
	}
	gs.imu.Unlock()
	for _, g := range gs.GPUs {
		g.Slots.Namespaces(fn)
	}
	gs.Chain.Namespaces(fn)
}

// DeleteNS removes namespace ns from every tier.
func (gs *GPUSet) DeleteNS(ns uint32) int {
	return gs.DeleteNamespaces(map[uint32]struct{}{ns: {}})
}

// DeleteNamespaces is DeleteNS of every namespace in nss, in one pass over
// each tier (Chain.DeleteNamespaces).
func (gs *GPUSet) DeleteNamespaces(nss map[uint32]struct{}) int {
	gs.tmu.Lock()
	defer gs.tmu.Unlock()
	gs.tombstone(func(x Key) bool { _, ok := nss[x.NS]; return ok })
	// The count is of distinct blocks: a GPU block counts unless the chain
	// holds it too (no copy commits meanwhile: tmu is held).
	onGPU := map[Key]bool{}
	for _, g := range gs.GPUs {
		for ns := range nss {
			g.Slots.deleteNS(ns, func(k Key) { onGPU[k] = true })
		}
	}
	extra := 0
	for k := range onGPU {
		if !gs.Chain.Host.Contains(k) && !gs.Chain.inNVMe(k) {
			extra++
		}
	}
	return gs.Chain.DeleteNamespaces(nss) + extra
}

// GPUStats describes the GPU tier.
type GPUStats struct {
	Devices   []HostStats
	Demotions []uint64 // per device: blocks demoted to the host tier
	// PromotionFallbacks per device: device reads of host blocks served
	// from the host tier because the arena had no room to promote them.
	PromotionFallbacks                  []uint64
	Promoted, Demoted, Migrated, ToHost uint64
	CopyErrors, CompactErrors           uint64
	// Copies per direction: host → gpu (promotions), gpu → host
	// (demotions and copies for host readers), gpu → gpu (migrations).
	HostToGPU, GPUToHost, GPUToGPU MoveStats
}

// Stats returns the GPU tier's counters and each arena's allocator stats.
func (gs *GPUSet) Stats() GPUStats {
	st := GPUStats{Promoted: gs.promoted.Load(), Demoted: gs.demoted.Load(), Migrated: gs.migrated.Load(),
		ToHost: gs.toHost.Load(), CopyErrors: gs.copyErrors.Load(), CompactErrors: gs.compactErrors.Load(),
		HostToGPU: gs.up.stats(), GPUToHost: gs.down.stats(), GPUToGPU: gs.peer.stats()}
	for _, g := range gs.GPUs {
		st.Devices = append(st.Devices, g.Slots.Stats())
		st.Demotions = append(st.Demotions, g.demoted.Load())
		st.PromotionFallbacks = append(st.PromotionFallbacks, g.fallbacks.Load())
	}
	return st
}
