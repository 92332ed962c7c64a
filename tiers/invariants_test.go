package tiers

import (
	"errors"
	"fmt"
	"sort"
)

// checkHost recomputes the allocator's state from the slabs up and compares
// it with every incremental structure and counter. It is the oracle of the
// property tests: any drift in bookkeeping shows up here.
func checkHost(h *Host) error {
	h.mu.Lock()
	defer h.mu.Unlock()

	// Pool.
	inPool := make(map[*slab]bool, len(h.pool))
	for _, s := range h.pool {
		if inPool[s] {
			return fmt.Errorf("slab %d twice in pool", s.base/h.slabBytes)
		}
		inPool[s] = true
		if s.cls != nil {
			return fmt.Errorf("pooled slab %d owned by class %d", s.base/h.slabBytes, s.cls.size)
		}
	}
	owned := 0
	for i := range h.slabs {
		s := &h.slabs[i]
		if s.base != int64(i)*h.slabBytes {
			return fmt.Errorf("slab %d base %d", i, s.base)
		}
		if (s.cls == nil) != inPool[s] {
			return fmt.Errorf("slab %d: owner %v but inPool=%v", i, s.cls != nil, inPool[s])
		}
		if s.cls != nil {
			owned++
		}
	}

	type iv struct{ off, end int64 }
	var ivs []iv
	var used, parkedUsed int64
	committed, reserved, leased := 0, 0, 0
	occupants := map[*Handle]bool{}
	classSlabs := 0

	if !sort.SliceIsSorted(h.classList, func(i, j int) bool { return h.classList[i].size < h.classList[j].size }) {
		return fmt.Errorf("classList not sorted")
	}
	if len(h.classList) != len(h.classes) {
		return fmt.Errorf("classList %d vs classes %d", len(h.classList), len(h.classes))
	}
	for _, c := range h.classList {
		if h.classes[c.size] != c {
			return fmt.Errorf("class %d not in map", c.size)
		}
		if c.stride%h.align != 0 || c.stride < c.size || c.stride-c.size >= h.align {
			return fmt.Errorf("class %d stride %d", c.size, c.stride)
		}
		if c.spp != int(h.slabBytes/c.stride) || c.spp < 1 {
			return fmt.Errorf("class %d spp %d", c.size, c.spp)
		}
		if waste := h.slabBytes - int64(c.spp)*c.stride; waste < 0 || waste >= c.stride {
			return fmt.Errorf("class %d tail waste %d >= stride %d", c.size, waste, c.stride)
		}
		live, unpinned, lruWant := 0, 0, 0
		inHeap := 0
		for pos, s := range c.slabs {
			classSlabs++
			if s.cls != c || s.clsPos != pos {
				return fmt.Errorf("class %d slab %d: cls/pos mismatch", c.size, pos)
			}
			if len(s.slots) != c.spp || s.bump > c.spp {
				return fmt.Errorf("class %d slab: %d slots bump %d", c.size, len(s.slots), s.bump)
			}
			n, pinned := 0, 0
			for j, hd := range s.slots {
				if hd == nil {
					continue
				}
				if j >= s.bump {
					return fmt.Errorf("occupied slot %d beyond bump %d", j, s.bump)
				}
				if occupants[hd] {
					return fmt.Errorf("handle %v in two slots", hd.Key)
				}
				occupants[hd] = true
				n++
				if hd.cls != c || hd.Size != c.size || int(hd.slot) != j || &h.slabs[hd.slab] != s {
					return fmt.Errorf("handle %v location mismatch", hd.Key)
				}
				if hd.Offset != s.base+int64(j)*c.stride || hd.Offset%h.align != 0 ||
					hd.Offset+hd.Size > s.base+h.slabBytes || hd.Offset+hd.Size > h.size {
					return fmt.Errorf("handle %v bad offset %d", hd.Key, hd.Offset)
				}
				ivs = append(ivs, iv{hd.Offset, hd.Offset + hd.Size})
				used += hd.Size
				if hd.parked {
					parkedUsed += hd.Size
				}
				if hd.leases > 0 {
					leased++
				}
				switch hd.state {
				case stateReserved:
					reserved++
					pinned++
					if hd.leases != 0 || h.index[hd.Key] != hd {
						return fmt.Errorf("reserved %v: leases %d, indexed %v", hd.Key, hd.leases, h.index[hd.Key] == hd)
					}
				case stateCommitted:
					committed++
					if h.index[hd.Key] != hd {
						return fmt.Errorf("committed %v not indexed", hd.Key)
					}
					if hd.leases > 0 {
						pinned++
					} else {
						lruWant++
					}
				case stateDeleted:
					if hd.leases <= 0 || h.index[hd.Key] == hd {
						return fmt.Errorf("deleted %v: leases %d, indexed %v", hd.Key, hd.leases, h.index[hd.Key] == hd)
					}
					pinned++
				default:
					return fmt.Errorf("occupant %v in state %d", hd.Key, hd.state)
				}
			}
			if n == 0 || n != s.live || pinned != s.pinned {
				return fmt.Errorf("class %d slab %d: live %d/%d pinned %d/%d", c.size, s.base/h.slabBytes, n, s.live, pinned, s.pinned)
			}
			seen := map[int32]bool{}
			for _, f := range s.free {
				if int(f) >= s.bump || s.slots[f] != nil || seen[f] {
					return fmt.Errorf("bad free slot %d", f)
				}
				seen[f] = true
			}
			if len(s.free) != s.bump-n {
				return fmt.Errorf("free list %d, want %d", len(s.free), s.bump-n)
			}
			if s.pinned == 0 {
				unpinned++
			}
			live += n
			if n < c.spp {
				if s.heapIdx < 0 || s.heapIdx >= len(c.partial) || c.partial[s.heapIdx] != s {
					return fmt.Errorf("partial slab missing from heap")
				}
				inHeap++
			} else if s.heapIdx != -1 {
				return fmt.Errorf("full slab in heap")
			}
		}
		if inHeap != len(c.partial) {
			return fmt.Errorf("heap has %d, want %d", len(c.partial), inHeap)
		}
		for i := 1; i < len(c.partial); i++ {
			if c.partial.Less(i, (i-1)/2) {
				return fmt.Errorf("heap order broken")
			}
		}
		if live != c.live || unpinned != c.unpinned {
			return fmt.Errorf("class %d: live %d/%d unpinned %d/%d", c.size, live, c.live, unpinned, c.unpinned)
		}
		// Compaction is lazy, so a class may hold any number of free slots
		// between allocations; the fragmentation bound applies when a Reserve
		// is about to evict or fail (checkPressure).
		// LRU: committed unleased blocks of the class, newest first.
		n := 0
		var prev *Handle
		for e := c.lru.head; e != nil; e = e.next {
			if e.state != stateCommitted || e.leases != 0 || e.cls != c || !occupants[e] || e.prev != prev {
				return fmt.Errorf("bad LRU entry %v", e.Key)
			}
			if prev != nil && prev.stamp <= e.stamp {
				return fmt.Errorf("LRU not ordered by stamp")
			}
			prev = e
			n++
		}
		if c.lru.tail != prev || n != c.lru.n || n != lruWant {
			return fmt.Errorf("class %d LRU: %d entries, n %d, want %d", c.size, n, c.lru.n, lruWant)
		}
	}
	if classSlabs != owned {
		return fmt.Errorf("classes own %d slabs, %d not pooled", classSlabs, owned)
	}

	sort.Slice(ivs, func(i, j int) bool { return ivs[i].off < ivs[j].off })
	for i := 1; i < len(ivs); i++ {
		if ivs[i].off < ivs[i-1].end {
			return fmt.Errorf("slots overlap at %d", ivs[i].off)
		}
	}

	for k, hd := range h.index {
		if hd.Key != k || !occupants[hd] || (hd.state != stateReserved && hd.state != stateCommitted) {
			return fmt.Errorf("index entry %v invalid", k)
		}
	}
	nsTotal := 0
	for ns, l := range h.ns {
		n := 0
		for e := l.head; e != nil; e = e.nsNext {
			if e.Key.NS != ns || e.state != stateCommitted || h.index[e.Key] != e {
				return fmt.Errorf("bad ns entry %v", e.Key)
			}
			n++
		}
		if n == 0 || n != l.n {
			return fmt.Errorf("ns %d list %d/%d", ns, n, l.n)
		}
		nsTotal += n
	}
	if nsTotal != committed {
		return fmt.Errorf("ns lists hold %d, committed %d", nsTotal, committed)
	}
	if used != h.used || committed != h.committed || reserved != h.reserved || leased != h.leased {
		return fmt.Errorf("counters: used %d/%d committed %d/%d reserved %d/%d leased %d/%d",
			used, h.used, committed, h.committed, reserved, h.reserved, leased, h.leased)
	}
	if parkedUsed != h.parkedUsed {
		return fmt.Errorf("parked bytes %d, handles marked parked sum to %d", h.parkedUsed, parkedUsed)
	}
	if len(h.index) != committed+reserved {
		return fmt.Errorf("index %d, want %d", len(h.index), committed+reserved)
	}
	return nil
}

// servable reports why a Reserve of size could be served without evicting
// (a free slot of its class, a free slab, or a class that compaction can take
// a slab from), or "" if it cannot. Callers hold h.mu.
func servable(h *Host, size int64) string {
	if c := h.classes[size]; c != nil && c.freeSlots() > 0 {
		return fmt.Sprintf("class %d has %d free slots", size, c.freeSlots())
	}
	if len(h.pool) > 0 {
		return fmt.Sprintf("%d free slabs", len(h.pool))
	}
	for _, d := range h.classList {
		if d.unpinned > 0 && d.freeSlots() >= d.spp {
			return fmt.Sprintf("class %d is compactable: %d free slots >= spp %d, %d unpinned slabs",
				d.size, d.freeSlots(), d.spp, d.unpinned)
		}
	}
	return ""
}

// strandedBound checks the fragmentation bound of the package doc: every
// class d holds at most (P+1)*(spp-1) free slots, P being the number of its
// slabs holding a pinned block. It holds whenever servable is "" (every
// class is compacted as far as pins allow), not between allocations.
// Callers hold h.mu.
func strandedBound(h *Host) error {
	for _, d := range h.classList {
		pinned := len(d.slabs) - d.unpinned
		if free, bound := d.freeSlots(), (pinned+1)*(d.spp-1); free > bound {
			return fmt.Errorf("class %d: %d free slots > (%d pinned slabs + 1) * (spp %d - 1)",
				d.size, free, pinned, d.spp)
		}
	}
	return nil
}

// pressure is the state a Reserve started from, captured by capturePressure.
type pressure struct {
	servable    string // why it could be served without evicting; "" if not
	bound       error  // strandedBound of that state
	needsSlab   bool   // no free slot in the class and no free slab
	evictions   uint64
	compactions uint64
}

func capturePressure(h *Host, size int64) pressure {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.classes[size]
	return pressure{
		servable:    servable(h, size),
		bound:       strandedBound(h),
		needsSlab:   len(h.pool) == 0 && (c == nil || c.freeSlots() == 0),
		evictions:   h.evictions,
		compactions: h.compactions,
	}
}

// checkPressure verifies the lazy-compaction contract of one Reserve that
// started from p and returned err:
//   - it evicted or returned ErrFull only if it could not be served without
//     evicting (compaction was exhausted first), and then the fragmentation
//     bound held;
//   - it compacted only if it needed a slab and none was free, and at most
//     once.
func checkPressure(h *Host, p pressure, err error) error {
	h.mu.Lock()
	evictions, compactions := h.evictions-p.evictions, h.compactions-p.compactions
	h.mu.Unlock()
	if evictions > 0 || errors.Is(err, ErrFull) {
		if p.servable != "" {
			return fmt.Errorf("evicted %d (err %v) although %s", evictions, err, p.servable)
		}
		if p.bound != nil {
			return fmt.Errorf("evicted %d (err %v) with stranded space over the bound: %v", evictions, err, p.bound)
		}
	}
	if compactions > 1 || (compactions == 1 && !p.needsSlab) {
		return fmt.Errorf("%d compactions; needed a slab: %v", compactions, p.needsSlab)
	}
	return nil
}
