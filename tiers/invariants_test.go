package tiers

import (
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
	var used int64
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
					hd.Offset+hd.Size > s.base+h.slabBytes || hd.Offset+hd.Size > int64(len(h.arena)) {
					return fmt.Errorf("handle %v bad offset %d", hd.Key, hd.Offset)
				}
				ivs = append(ivs, iv{hd.Offset, hd.Offset + hd.Size})
				used += hd.Size
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
		// The fragmentation bound: compaction leaves fewer than one slab's
		// worth of stranded free slots unless every slab is pinned.
		if free := c.freeSlots(); free >= c.spp && c.unpinned > 0 {
			return fmt.Errorf("class %d: %d free slots >= spp %d with %d unpinned slabs", c.size, free, c.spp, c.unpinned)
		}
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
	if len(h.index) != committed+reserved {
		return fmt.Errorf("index %d, want %d", len(h.index), committed+reserved)
	}
	return nil
}
