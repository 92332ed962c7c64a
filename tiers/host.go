package tiers

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/kvtier/kvtier/shm"
)

// Key identifies a block: namespace id plus the chained 128-bit hash.
type Key struct {
	NS   uint32
	Hash shm.Hash
}

var (
	// ErrExists: Reserve of a key that is committed or being reserved.
	ErrExists = errors.New("block already present")
	// ErrFull: nothing can be evicted to make room.
	ErrFull = errors.New("host tier full: every block is leased or reserved")
	// ErrTooLarge: the block does not fit in one slab.
	ErrTooLarge = errors.New("block larger than a slab")
	// ErrBadSize: size <= 0.
	ErrBadSize = errors.New("invalid block size")
	// ErrHandleState: Commit/Abort of a handle that is not reserved, Release
	// of one without a lease, or a handle of another Host.
	ErrHandleState = errors.New("handle not in the required state")
)

// HostConfig sizes the allocator.
type HostConfig struct {
	SlabBytes int64 // size of a slab; the arena length must be a multiple
	Align     int64 // slot alignment inside a slab (default 4096); SlabBytes must be a multiple
	// Move, if set, moves n bytes inside the managed memory for compaction
	// instead of a copy over the arena slice: a device arena (NewSlots) has
	// no slice. It runs under the tier's lock and must be synchronous; it
	// only ever moves unpinned blocks (never leased or reserved ones). A
	// block whose move fails is dropped.
	Move func(dst, src, n int64) error
	// NoEvict makes Reserve fail with ErrFull instead of evicting: the GPU
	// tier demotes to the host tier rather than dropping blocks.
	NoEvict bool
}

// DefaultAlign is used when HostConfig.Align is zero: page alignment keeps
// every slot usable for DMA registration and O_DIRECT-sized copies.
const DefaultAlign = 4096

// HostStats is a snapshot of the host tier.
type HostStats struct {
	CapacityBytes int64
	// UsedBytes sums the block sizes (not strides) of every occupied slot:
	// committed, reserved, and deleted-but-still-leased blocks.
	UsedBytes  int64
	SlabBytes  int64
	SlabsTotal int
	SlabsFree  int
	Blocks     int // committed blocks in the index
	Reserved   int // reservations not yet committed or aborted
	Leased     int // blocks with at least one lease (including deleted ones)

	Hits, Misses    uint64
	Evictions       uint64
	Compactions     uint64 // slabs freed by compaction
	CompactedBlocks uint64 // blocks moved by compaction
	Classes         []ClassStats
}

// ClassStats describes one block-size class.
type ClassStats struct {
	Size, Stride int64
	SlotsPerSlab int
	Slabs        int
	Blocks       int // occupied slots (any state)
	FreeSlots    int // free slots inside the class's slabs
}

type blockState uint8

const (
	stateDead      blockState = iota // aborted, evicted, or deleted and released
	stateReserved                    // in the index, invisible to readers, pinned
	stateCommitted                   // in the index and visible
	stateDeleted                     // out of the index, still leased; freed on last release
)

// Handle is both the index entry and what callers hold. Callers read Key,
// Offset and Size only; Offset is stable while they hold a reservation or a
// lease (pinned blocks never move).
type Handle struct {
	Key    Key
	Offset int64
	Size   int64

	host   *Host
	cls    *class
	state  blockState
	parked bool // counted in Host.parkedUsed: a parked block held only here
	leases int32
	slab   int32
	slot   int32
	stamp  uint64 // recency tick of the last access

	prev, next     *Handle // class LRU list: committed and unleased only
	nsPrev, nsNext *Handle // namespace list: committed blocks in the index
}

// list is an intrusive doubly linked list; head is MRU, tail is LRU.
type list struct {
	head, tail *Handle
	n          int
}

func (l *list) pushFront(h *Handle) {
	h.prev, h.next = nil, l.head
	if l.head != nil {
		l.head.prev = h
	} else {
		l.tail = h
	}
	l.head = h
	l.n++
}

func (l *list) remove(h *Handle) {
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		l.head = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	} else {
		l.tail = h.prev
	}
	h.prev, h.next = nil, nil
	l.n--
}

type nsList struct {
	head *Handle
	n    int
}

func (l *nsList) push(h *Handle) {
	h.nsPrev, h.nsNext = nil, l.head
	if l.head != nil {
		l.head.nsPrev = h
	}
	l.head = h
	l.n++
}

func (l *nsList) remove(h *Handle) {
	if h.nsPrev != nil {
		h.nsPrev.nsNext = h.nsNext
	} else {
		l.head = h.nsNext
	}
	if h.nsNext != nil {
		h.nsNext.nsPrev = h.nsPrev
	}
	h.nsPrev, h.nsNext = nil, nil
	l.n--
}

type slab struct {
	cls     *class // nil while in the free-slab pool
	base    int64
	live    int // occupied slots
	pinned  int // occupied slots that are reserved or leased
	bump    int // slots [bump, spp) have never been used since assignment
	free    []int32
	slots   []*Handle
	heapIdx int // position in cls.partial, -1 if absent (full or draining)
	clsPos  int // position in cls.slabs
}

type class struct {
	size, stride int64
	spp          int     // slots per slab
	slabs        []*slab // owned slabs, never empty
	partial      slabHeap
	live         int  // occupied slots over all slabs
	unpinned     int  // owned slabs with pinned == 0
	lru          list // committed, unleased blocks
}

func (c *class) freeSlots() int { return len(c.slabs)*c.spp - c.live }

// slabHeap orders a class's slabs that have a free slot, fullest first, so
// allocation fills dense slabs and lets sparse ones drain and return to the
// pool (cheaper compaction, or none).
type slabHeap []*slab

func (q slabHeap) Len() int { return len(q) }
func (q slabHeap) Less(i, j int) bool {
	if q[i].live != q[j].live {
		return q[i].live > q[j].live
	}
	return q[i].base < q[j].base
}
func (q slabHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].heapIdx = i
	q[j].heapIdx = j
}
func (q *slabHeap) Push(x any) {
	s := x.(*slab)
	s.heapIdx = len(*q)
	*q = append(*q, s)
}
func (q *slabHeap) Pop() any {
	old := *q
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	s.heapIdx = -1
	return s
}

// Host is the host tier's allocator and index. It is safe for concurrent use.
type Host struct {
	// onRemove, if set, is told (under mu) of every committed block that
	// leaves the index, so a replacement policy can forget it.
	onRemove func(Key)

	mu        sync.Mutex
	arena     []byte
	size      int64 // managed bytes: len(arena), or NewSlots' size
	move      func(dst, src, n int64) error
	noEvict   bool
	slabBytes int64
	align     int64
	slabs     []slab
	pool      []*slab // free slabs (stack)
	classes   map[int64]*class
	classList []*class // sorted by size
	index     map[Key]*Handle
	ns        map[uint32]*nsList
	tick      uint64
	scratch   []*Handle // Lookup's reverse-touch buffer, reused under mu

	used                     int64
	parkedUsed               int64 // bytes of handles with parked set
	committed, reserved      int
	leased                   int
	hits, misses, evictions  uint64
	compactions, compactedBl uint64
}

// NewHost manages arena (the mapped host arena). The allocator touches the
// bytes only to move blocks during compaction.
func NewHost(arena []byte, cfg HostConfig) (*Host, error) {
	if len(arena) == 0 {
		return nil, fmt.Errorf("tiers: arena length 0 must be a positive multiple of slab size %d", cfg.SlabBytes)
	}
	return newSlabHost(arena, int64(len(arena)), cfg)
}

// NewSlots manages size bytes of memory the allocator cannot address as a
// slice (a GPU arena): Bytes must not be called, and compaction moves
// blocks through cfg.Move, which is required.
func NewSlots(size int64, cfg HostConfig) (*Host, error) {
	if cfg.Move == nil {
		return nil, fmt.Errorf("tiers: NewSlots needs a Move function")
	}
	return newSlabHost(nil, size, cfg)
}

func newSlabHost(arena []byte, size int64, cfg HostConfig) (*Host, error) {
	if cfg.Align == 0 {
		cfg.Align = DefaultAlign
	}
	switch {
	case cfg.Align < 0:
		return nil, fmt.Errorf("tiers: align %d must be positive", cfg.Align)
	case cfg.SlabBytes <= 0 || cfg.SlabBytes%cfg.Align != 0:
		return nil, fmt.Errorf("tiers: slab size %d must be a positive multiple of align %d", cfg.SlabBytes, cfg.Align)
	case size <= 0 || size%cfg.SlabBytes != 0:
		return nil, fmt.Errorf("tiers: arena length %d must be a positive multiple of slab size %d", size, cfg.SlabBytes)
	case size/cfg.SlabBytes > 1<<31-1 || cfg.SlabBytes/cfg.Align > 1<<31-1:
		return nil, fmt.Errorf("tiers: too many slabs or slots per slab")
	}
	n := int(size / cfg.SlabBytes)
	h := &Host{
		arena:     arena,
		size:      size,
		move:      cfg.Move,
		noEvict:   cfg.NoEvict,
		slabBytes: cfg.SlabBytes,
		align:     cfg.Align,
		slabs:     make([]slab, n),
		pool:      make([]*slab, 0, n),
		classes:   make(map[int64]*class),
		index:     make(map[Key]*Handle),
		ns:        make(map[uint32]*nsList),
	}
	// Pool is a stack: push high indices first so low addresses are used first.
	for i := n - 1; i >= 0; i-- {
		s := &h.slabs[i]
		s.base = int64(i) * cfg.SlabBytes
		s.heapIdx = -1
		h.pool = append(h.pool, s)
	}
	return h, nil
}

func (h *Host) nextTick() uint64 { h.tick++; return h.tick }

func (h *Host) classFor(size int64) *class {
	if c := h.classes[size]; c != nil {
		return c
	}
	stride := (size + h.align - 1) / h.align * h.align
	c := &class{size: size, stride: stride, spp: int(h.slabBytes / stride)}
	h.classes[size] = c
	i := sort.Search(len(h.classList), func(i int) bool { return h.classList[i].size > size })
	h.classList = append(h.classList, nil)
	copy(h.classList[i+1:], h.classList[i:])
	h.classList[i] = c
	return c
}

// Reserve allocates a slot for key. See the package doc for eviction rules.
func (h *Host) Reserve(key Key, size int64) (*Handle, error) {
	return h.reserve(key, size, key.Parked())
}

// ReserveCopy is Reserve for a copy of a block a tier below holds (a
// promotion): a parked block's copy is not counted in ParkedBytes again.
func (h *Host) ReserveCopy(key Key, size int64) (*Handle, error) {
	return h.reserve(key, size, false)
}

// ParkedBytes is the size of the parked blocks (reserved or committed)
// that the host tier holds other than as copies of NVMe's (ReserveCopy):
// those on their way down, or held after a failed write-through.
func (h *Host) ParkedBytes() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.parkedUsed
}

// Copied tells the tier that a tier below now holds a copy of the
// committed block hd: a parked block no longer counts in ParkedBytes. It
// reports whether hd is still committed here.
func (h *Host) Copied(hd *Handle) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.holdsLocked(hd) {
		return false
	}
	if hd.parked {
		h.parkedUsed -= hd.Size
		hd.parked = false
	}
	return true
}

func (h *Host) reserve(key Key, size int64, parked bool) (*Handle, error) {
	if size <= 0 {
		return nil, ErrBadSize
	}
	if size > h.slabBytes {
		return nil, ErrTooLarge
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.index[key]; ok {
		return nil, ErrExists
	}
	c := h.classFor(size)
	s, slot, err := h.allocSlot(c)
	if err != nil {
		return nil, err
	}
	hd := &Handle{
		Key:    key,
		Offset: s.base + int64(slot)*c.stride,
		Size:   size,
		host:   h,
		cls:    c,
		state:  stateReserved,
		slab:   int32(s.base / h.slabBytes),
		slot:   int32(slot),
		parked: parked,
	}
	s.slots[slot] = hd
	h.pin(s)
	h.index[key] = hd
	h.reserved++
	h.addUsed(hd)
	return hd, nil
}

func (h *Host) allocSlot(c *class) (*slab, int, error) {
	var target *class
	for {
		if len(c.partial) > 0 {
			s := c.partial[0]
			return s, h.takeSlot(s), nil
		}
		if n := len(h.pool); n > 0 {
			s := h.pool[n-1]
			h.pool = h.pool[:n-1]
			h.assignSlab(s, c)
			continue
		}
		// Compaction is lazy: stranded free slots are reclaimed only here,
		// when a class needs a slab and none is free. It is tried before
		// every eviction (after evicting from a class D, it is what turns
		// D's freed slots into a slab). c itself has no free slot here.
		if s := h.compactable(); s != nil {
			h.drain(s)
			continue
		}
		if h.noEvict {
			return nil, 0, ErrFull
		}
		if target == nil {
			if target = h.victimClass(c); target == nil {
				return nil, 0, ErrFull
			}
		}
		v := target.lru.tail
		if v == nil { // unreachable: a chosen class can always yield
			return nil, 0, ErrFull
		}
		h.evict(v)
	}
}

// compactable returns the slab whose drain frees a slab at the least copying
// cost: the unpinned slab with the fewest live bytes among classes that hold
// at least slotsPerSlab free slots (so its blocks fit in the class's other
// slabs). Nil if no class can be compacted.
func (h *Host) compactable() *slab {
	var best *slab
	var bestBytes int64
	for _, d := range h.classList {
		if d.unpinned == 0 || d.freeSlots() < d.spp {
			continue
		}
		for _, s := range d.slabs {
			if s.pinned != 0 {
				continue
			}
			if n := int64(s.live) * d.size; best == nil || n < bestBytes {
				best, bestBytes = s, n
			}
		}
	}
	return best
}

// victimClass picks the class whose LRU block is globally oldest among those
// whose evictions can serve c: c itself (one eviction frees a slot), or a
// class owning a slab with no pinned slot (evicting at most that slab's live
// blocks brings its free slots to ≥ slotsPerSlab, and compaction then frees a
// slab).
func (h *Host) victimClass(c *class) *class {
	var best *class
	for _, d := range h.classList {
		t := d.lru.tail
		if t == nil || (d != c && d.unpinned == 0) {
			continue
		}
		if best == nil || t.stamp < best.lru.tail.stamp {
			best = d
		}
	}
	return best
}

func (h *Host) assignSlab(s *slab, c *class) {
	s.cls = c
	s.live, s.pinned, s.bump = 0, 0, 0
	s.free = s.free[:0]
	if cap(s.slots) >= c.spp {
		s.slots = s.slots[:c.spp]
		clear(s.slots)
	} else {
		s.slots = make([]*Handle, c.spp)
	}
	s.clsPos = len(c.slabs)
	c.slabs = append(c.slabs, s)
	c.unpinned++
	heap.Push(&c.partial, s)
}

func (h *Host) releaseSlab(s *slab) {
	c := s.cls
	if s.heapIdx >= 0 {
		heap.Remove(&c.partial, s.heapIdx)
	}
	last := c.slabs[len(c.slabs)-1]
	c.slabs[s.clsPos] = last
	last.clsPos = s.clsPos
	c.slabs[len(c.slabs)-1] = nil
	c.slabs = c.slabs[:len(c.slabs)-1]
	c.unpinned-- // an empty slab is unpinned
	s.cls = nil
	h.pool = append(h.pool, s)
}

// takeSlot occupies a free slot of s; the caller stores the occupant.
func (h *Host) takeSlot(s *slab) int {
	var slot int
	if n := len(s.free); n > 0 {
		slot = int(s.free[n-1])
		s.free = s.free[:n-1]
	} else {
		slot = s.bump
		s.bump++
	}
	s.live++
	s.cls.live++
	if s.heapIdx >= 0 {
		if s.live == s.cls.spp {
			heap.Remove(&s.cls.partial, s.heapIdx)
		} else {
			heap.Fix(&s.cls.partial, s.heapIdx)
		}
	}
	return slot
}

// freeSlot vacates hd's slot (hd must already be unpinned and out of every
// list). It never compacts: free slots stay where they are until the class
// reuses them or another class needs a slab (see allocSlot).
// untakeSlot gives back a slot takeSlot took from the partial slab s.
func (h *Host) untakeSlot(s *slab, slot int) {
	s.free = append(s.free, int32(slot))
	s.live--
	s.cls.live--
	if s.heapIdx >= 0 {
		heap.Fix(&s.cls.partial, s.heapIdx)
	} else {
		heap.Push(&s.cls.partial, s)
	}
}

func (h *Host) freeSlot(hd *Handle) {
	s := &h.slabs[hd.slab]
	c := s.cls
	s.slots[hd.slot] = nil
	s.free = append(s.free, hd.slot)
	s.live--
	c.live--
	h.subUsed(hd)
	hd.state = stateDead
	if s.live == 0 {
		h.releaseSlab(s)
	} else if s.heapIdx >= 0 {
		heap.Fix(&c.partial, s.heapIdx)
	} else {
		heap.Push(&c.partial, s)
	}
}

// addUsed and subUsed account for hd's bytes as it takes and leaves a
// slot. mu held.
func (h *Host) addUsed(hd *Handle) {
	h.used += hd.Size
	if hd.parked {
		h.parkedUsed += hd.Size
	}
}

func (h *Host) subUsed(hd *Handle) {
	h.used -= hd.Size
	if hd.parked {
		h.parkedUsed -= hd.Size
	}
}

func (h *Host) pin(s *slab) {
	if s.pinned == 0 {
		s.cls.unpinned--
	}
	s.pinned++
}

// unpin drops one pin. A slab that becomes unpinned is movable again, but
// is only compacted when another class needs a slab.
func (h *Host) unpin(s *slab) {
	s.pinned--
	if s.pinned == 0 {
		s.cls.unpinned++
	}
}

// drain moves every block of the unpinned slab s into free slots of the
// class's other slabs and returns s to the pool. The caller guarantees
// freeSlots >= spp, so the other slabs have at least s.live free slots
// (F-(spp-live) >= live).
func (h *Host) drain(s *slab) {
	c := s.cls
	if s.heapIdx >= 0 {
		heap.Remove(&c.partial, s.heapIdx)
	}
	for i, hd := range s.slots {
		if hd == nil {
			continue
		}
		if len(c.partial) == 0 {
			panic("tiers: compaction found no destination slot")
		}
		d := c.partial[0]
		slot := h.takeSlot(d)
		off := d.base + int64(slot)*c.stride
		var err error
		if h.move != nil {
			err = h.move(off, hd.Offset, hd.Size)
		} else {
			copy(h.arena[off:off+hd.Size], h.arena[hd.Offset:hd.Offset+hd.Size])
		}
		if err != nil {
			// The copy failed: give the slot back and drop the block
			// (committed and unleased: the slab is unpinned) rather than
			// keep it at a slot never written. Not an eviction: the
			// Move hook counts its failures (the GPU tier's compaction
			// errors), and a GPU arena never evicts.
			h.untakeSlot(d, slot)
			c.lru.remove(hd)
			h.unindex(hd)
			h.subUsed(hd)
			hd.state = stateDead
			s.free = append(s.free, int32(i))
		} else {
			d.slots[slot] = hd
			hd.Offset = off
			hd.slab = int32(d.base / h.slabBytes)
			hd.slot = int32(slot)
			h.compactedBl++
		}
		s.slots[i] = nil
		s.live--
		c.live--
	}
	h.compactions++
	h.releaseSlab(s)
}

func (h *Host) evict(hd *Handle) {
	hd.cls.lru.remove(hd)
	h.unindex(hd)
	h.evictions++
	h.freeSlot(hd)
}

// unindex removes a committed block from the index and namespace list.
func (h *Host) unindex(hd *Handle) {
	delete(h.index, hd.Key)
	l := h.ns[hd.Key.NS]
	l.remove(hd)
	if l.n == 0 {
		delete(h.ns, hd.Key.NS)
	}
	h.committed--
	if h.onRemove != nil {
		h.onRemove(hd.Key)
	}
}

func (h *Host) check(hd *Handle) error {
	if hd == nil || hd.host != h {
		return fmt.Errorf("%w: nil or foreign handle", ErrHandleState)
	}
	return nil
}

// Commit makes a reserved block visible to Lookup and Acquire, as MRU.
func (h *Host) Commit(hd *Handle) error {
	if err := h.check(hd); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.commitLocked(hd)
}

// CommitPinned commits hd and pins it (as Pin) in one step, so that nothing
// (a demoter, eviction) can take the new block before the one who copied it
// hands it to its readers. Unpin it after.
func (h *Host) CommitPinned(hd *Handle) error {
	if err := h.check(hd); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.commitLocked(hd); err != nil {
		return err
	}
	h.pinLocked(hd)
	return nil
}

func (h *Host) commitLocked(hd *Handle) error {
	if hd.state != stateReserved {
		return fmt.Errorf("%w: commit of a block that is not reserved", ErrHandleState)
	}
	if h.index[hd.Key] != hd {
		return fmt.Errorf("%w: commit of a disowned reservation", ErrHandleState)
	}
	hd.state = stateCommitted
	h.reserved--
	h.committed++
	l := h.ns[hd.Key.NS]
	if l == nil {
		l = &nsList{}
		h.ns[hd.Key.NS] = l
	}
	l.push(hd)
	hd.stamp = h.nextTick()
	hd.cls.lru.pushFront(hd)
	h.unpin(&h.slabs[hd.slab])
	return nil
}

// Abort frees a reservation.
func (h *Host) Abort(hd *Handle) error {
	if err := h.check(hd); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd.state != stateReserved {
		return fmt.Errorf("%w: abort of a block that is not reserved", ErrHandleState)
	}
	if h.index[hd.Key] == hd { // else disowned (Disown)
		delete(h.index, hd.Key)
	}
	h.reserved--
	h.unpin(&h.slabs[hd.slab])
	h.freeSlot(hd)
	return nil
}

// Disown removes the reservation hd from the index, so that its key can be
// reserved again, and reports whether it did. Its owner keeps the slot and
// must Abort it; it can no longer commit it. For a reservation that will
// never be committed (a promotion of a block deleted since).
func (h *Host) Disown(hd *Handle) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd.state != stateReserved || h.index[hd.Key] != hd {
		return false
	}
	delete(h.index, hd.Key)
	return true
}

// maxLeases caps a block's leases taken by Acquire. The count is an int32
// shared with the tiers' own movement pins (a few per block at most), so
// the cap leaves them room: sessions × leases per session could otherwise
// wrap it (max_sessions above 2,048 at a million leases each), and a
// negative count would free a block still read.
const maxLeases = math.MaxInt32 - 1<<16

// Acquire leases the committed block for key and makes it MRU. Leases are
// counted; the block is pinned until the last one is released. A block at
// maxLeases is not leased again (a miss) until some are released.
func (h *Host) Acquire(key Key) (*Handle, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := h.index[key]
	if hd == nil || hd.state != stateCommitted || hd.leases >= maxLeases {
		h.misses++
		return nil, false
	}
	h.hits++
	if hd.leases == 0 {
		hd.cls.lru.remove(hd)
		h.pin(&h.slabs[hd.slab])
		h.leased++
	}
	hd.leases++
	hd.stamp = h.nextTick()
	return hd, true
}

// countHit counts a hit on a block read by a copy to another tier (a
// device read promoted from here; for a GPU arena, a reader elsewhere
// served from its copy) rather than through a lease.
func (h *Host) countHit() {
	h.mu.Lock()
	h.hits++
	h.mu.Unlock()
}

// Release drops one lease. Handles are shared between the readers of a block,
// so the Host can only detect a release with no lease outstanding at all.
func (h *Host) Release(hd *Handle) error {
	if err := h.check(hd); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd.leases <= 0 || (hd.state != stateCommitted && hd.state != stateDeleted) {
		return fmt.Errorf("%w: release without a lease", ErrHandleState)
	}
	hd.leases--
	if hd.leases > 0 {
		return nil
	}
	h.leased--
	h.unpin(&h.slabs[hd.slab])
	if hd.state == stateDeleted {
		h.freeSlot(hd)
		return nil
	}
	hd.stamp = h.nextTick()
	hd.cls.lru.pushFront(hd)
	return nil
}

// Lookup returns how many leading keys of chain are committed here and sets
// tiers[i] = shm.TierHost for each; len(tiers) must be >= that count. Found
// blocks become MRU, since a lookup announces a read; they are touched from
// the chain's end back to its head so the head ends up most recent: a prefix
// missing its head is worthless, one missing its tail is merely shorter.
func (h *Host) Lookup(chain []Key, tiers []shm.Tier) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	found := h.scratch[:0]
	for i, k := range chain {
		hd := h.index[k]
		if hd == nil || hd.state != stateCommitted {
			break
		}
		tiers[i] = shm.TierHost
		found = append(found, hd)
	}
	for i := len(found) - 1; i >= 0; i-- {
		hd := found[i]
		hd.stamp = h.nextTick()
		if hd.leases == 0 {
			hd.cls.lru.remove(hd)
			hd.cls.lru.pushFront(hd)
		}
		found[i] = nil
	}
	h.scratch = found[:0]
	return len(found)
}

// Delete removes a committed key from the index. A leased block keeps its
// slot until its last lease is released. Reservations are owned by their
// reserver, so deleting one returns false.
func (h *Host) Delete(key Key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := h.index[key]
	if hd == nil || hd.state != stateCommitted {
		return false
	}
	h.delete(hd)
	return true
}

func (h *Host) delete(hd *Handle) {
	h.unindex(hd)
	if hd.leases > 0 {
		hd.state = stateDeleted
		return
	}
	hd.cls.lru.remove(hd)
	h.freeSlot(hd)
}

// DeleteNS removes every committed block of namespace ns and returns how many.
func (h *Host) DeleteNS(ns uint32) int { return h.deleteNS(ns, nil) }

// deleteNS is DeleteNS, calling each (if set) with every key removed.
func (h *Host) deleteNS(ns uint32, each func(Key)) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.ns[ns]
	if l == nil {
		return 0
	}
	n := 0
	for l.head != nil { // unindex drops the list from h.ns when it empties
		if each != nil {
			each(l.head.Key)
		}
		h.delete(l.head)
		n++
	}
	return n
}

// Namespaces calls fn with the namespace of every block the tier holds:
// committed (once per namespace), and reserved (disowned ones too) or
// deleted but still leased (once per block). It runs under the tier's lock
// (fn must not call the tier) and costs O(namespaces) plus the slots of the
// slabs holding a reserved or leased block (only those pin a slab).
func (h *Host) Namespaces(fn func(ns uint32)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ns := range h.ns {
		fn(ns)
	}
	for i := range h.slabs {
		s := &h.slabs[i]
		if s.cls == nil || s.pinned == 0 {
			continue
		}
		for _, hd := range s.slots {
			if hd != nil && hd.state != stateCommitted {
				fn(hd.Key.NS)
			}
		}
	}
}

// Stats returns a snapshot.
func (h *Host) Stats() HostStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := HostStats{
		CapacityBytes:   h.size,
		UsedBytes:       h.used,
		SlabBytes:       h.slabBytes,
		SlabsTotal:      len(h.slabs),
		SlabsFree:       len(h.pool),
		Blocks:          h.committed,
		Reserved:        h.reserved,
		Leased:          h.leased,
		Hits:            h.hits,
		Misses:          h.misses,
		Evictions:       h.evictions,
		Compactions:     h.compactions,
		CompactedBlocks: h.compactedBl,
		Classes:         make([]ClassStats, 0, len(h.classList)),
	}
	for _, c := range h.classList {
		st.Classes = append(st.Classes, ClassStats{
			Size: c.size, Stride: c.stride, SlotsPerSlab: c.spp,
			Slabs: len(c.slabs), Blocks: c.live, FreeSlots: c.freeSlots(),
		})
	}
	return st
}
