package tiers

// Movement support: the mover pins blocks while it copies them to or from a
// slower tier, then either drops them from the host tier (demotion) or
// leaves them. A movement pin is a lease that counts no hit: pinned blocks
// are never evicted, compacted or dropped under the copy.

// PinColdest pins up to n committed, unleased blocks, least recently used
// first, skipping those for which skip returns true (they stay in place).
func (h *Host) PinColdest(n int, skip func(Key) bool) []*Handle {
	if skip == nil {
		return h.pinColdest(n, nil)
	}
	return h.pinColdest(n, func(hd *Handle) bool { return skip(hd.Key) })
}

// pinColdest is PinColdest with skip given the block's handle (called
// under h.mu: it must not call h).
func (h *Host) pinColdest(n int, skip func(*Handle) bool) []*Handle {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*Handle
	// Each class has its own LRU list; stamps order them globally. Walk the
	// lists from their tails, always taking the globally oldest candidate.
	cursors := make(map[*class]*Handle, len(h.classList))
	for _, c := range h.classList {
		if c.lru.tail != nil {
			cursors[c] = c.lru.tail
		}
	}
	for len(out) < n && len(cursors) > 0 {
		var best *class
		for c, hd := range cursors {
			if best == nil || hd.stamp < cursors[best].stamp {
				best = c
			}
		}
		hd := cursors[best]
		if hd.prev != nil {
			cursors[best] = hd.prev
		} else {
			delete(cursors, best)
		}
		if skip != nil && skip(hd) {
			continue
		}
		h.pinLocked(hd)
		out = append(out, hd)
	}
	return out
}

// Occupied returns the bytes of the tier that a new block cannot take
// without an eviction, and the capacity: the capacity less the free slabs
// and the free slots of the slabs in use. It is the blocks' bytes (Usage)
// plus what the slabs waste on them: slot alignment, and the tail of a slab
// that its block size does not divide (blocks of 5 MiB fill a 64 MiB slab
// at 12, 93.75%). The mover's watermarks are of it, so that a tier full of
// such blocks is above them.
func (h *Host) Occupied() (occupied, capacity int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	free := int64(len(h.pool)) * h.slabBytes
	for _, c := range h.classList {
		free += int64(c.freeSlots()) * c.stride
	}
	return h.size - free, h.size
}

// Placeable reports whether blocks of sizes can be reserved without an
// eviction: in free slots of their classes, in free slabs, or in slabs
// that compaction frees (the free slots of a class with an unpinned slab,
// a slab's worth each). Sizes larger than a slab are left out (Reserve
// refuses them). The answer is a snapshot: others reserve meanwhile.
func (h *Host) Placeable(sizes []int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	need := map[int64]int{}
	for _, size := range sizes {
		if size > 0 && size <= h.slabBytes {
			need[size]++
		}
	}
	taken := map[*class]int{} // free slots the blocks take in existing classes
	slabs := 0
	for size, n := range need {
		c := h.classes[size]
		if c == nil {
			stride := (size + h.align - 1) / h.align * h.align
			spp := int(h.slabBytes / stride)
			slabs += (n + spp - 1) / spp
			continue
		}
		use := min(n, c.freeSlots())
		taken[c] = use
		if n > use {
			slabs += (n - use + c.spp - 1) / c.spp
		}
	}
	if slabs <= len(h.pool) {
		return true
	}
	reclaim := 0
	for _, d := range h.classList {
		if d.unpinned > 0 {
			reclaim += min((d.freeSlots()-taken[d])/d.spp, d.unpinned)
		}
	}
	return slabs <= len(h.pool)+reclaim
}

// SetOnRemove installs a callback run, under the tier's lock, whenever a
// committed block leaves the index (eviction, deletion, demotion). It must
// not call back into the Host.
func (h *Host) SetOnRemove(fn func(Key)) {
	h.mu.Lock()
	h.onRemove = fn
	h.mu.Unlock()
}

// PinUnleased pins the committed block for key if no reader holds it.
func (h *Host) PinUnleased(key Key) (*Handle, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := h.index[key]
	if hd == nil || hd.state != stateCommitted || hd.leases > 0 {
		return nil, false
	}
	h.pinLocked(hd)
	return hd, true
}

// PinAll pins every committed block (for a write-down at shutdown).
func (h *Host) PinAll() []*Handle {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Handle, 0, h.committed)
	for _, hd := range h.index {
		if hd.state == stateCommitted {
			h.pinLocked(hd)
			out = append(out, hd)
		}
	}
	return out
}

// Pin pins the committed block for key without counting a hit.
func (h *Host) Pin(key Key) (*Handle, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := h.index[key]
	if hd == nil || hd.state != stateCommitted {
		return nil, false
	}
	h.pinLocked(hd)
	return hd, true
}

// Holds reports whether hd is still the committed block of its key.
func (h *Host) Holds(hd *Handle) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.holdsLocked(hd)
}

// holdsLocked is Holds with h.mu held.
func (h *Host) holdsLocked(hd *Handle) bool {
	return hd.state == stateCommitted && h.index[hd.Key] == hd
}

// PinHandle pins hd if it is still the committed block of its key (not
// evicted, deleted, or replaced by a block put again under the key).
func (h *Host) PinHandle(hd *Handle) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.holdsLocked(hd) {
		return false
	}
	h.pinLocked(hd)
	return true
}

func (h *Host) pinLocked(hd *Handle) {
	if hd.leases == 0 {
		hd.cls.lru.remove(hd)
		h.pin(&h.slabs[hd.slab])
		h.leased++
	}
	hd.leases++
}

// Unpin drops a movement pin. With drop set, a block nobody else holds
// leaves the tier (its copy now lives below) and Unpin reports true;
// otherwise it becomes most recently used (a kept block was either read
// meanwhile or could not be written below, and must not be picked again at
// once).
func (h *Host) Unpin(hd *Handle, drop bool) (dropped bool, err error) {
	if err := h.check(hd); err != nil {
		return false, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd.leases <= 0 || (hd.state != stateCommitted && hd.state != stateDeleted) {
		return false, ErrHandleState
	}
	hd.leases--
	if hd.leases > 0 {
		return false, nil
	}
	h.leased--
	h.unpin(&h.slabs[hd.slab])
	switch {
	case hd.state == stateDeleted:
		h.freeSlot(hd)
	case drop:
		h.unindex(hd)
		h.freeSlot(hd)
		return true, nil
	default:
		hd.stamp = h.nextTick()
		hd.cls.lru.pushFront(hd)
	}
	return false, nil
}

// Contains reports whether key is committed in the host tier (no recency
// update).
func (h *Host) Contains(key Key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := h.index[key]
	return hd != nil && hd.state == stateCommitted
}

// ifAbsent runs fn under the tier's lock if key is not committed in the
// tier, and reports whether it ran: a commit of key is ordered after fn.
// Like the removal callback (SetOnRemove), fn must not call back into the
// Host.
func (h *Host) ifAbsent(key Key, fn func()) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd := h.index[key]; hd != nil && hd.state == stateCommitted {
		return false
	}
	fn()
	return true
}

// Bytes returns the arena bytes of a pinned, leased or reserved block.
func (h *Host) Bytes(hd *Handle) []byte {
	return h.arena[hd.Offset : hd.Offset+hd.Size : hd.Offset+hd.Size]
}

// Usage returns the bytes in use and the capacity.
func (h *Host) Usage() (used, capacity int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.used, h.size
}

// Owner is the tier (allocator) the handle belongs to.
func (hd *Handle) Owner() *Host { return hd.host }

// Present reports whether key is in the index in any state (reserved or
// committed), as Reserve's duplicate check sees it.
func (h *Host) Present(key Key) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.index[key]
	return ok
}

// Deleted reports whether the pinned or leased block hd was deleted since
// it was pinned.
func (h *Host) Deleted(hd *Handle) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return hd.state == stateDeleted
}
