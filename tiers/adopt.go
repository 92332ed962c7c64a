package tiers

import (
	"container/heap"
	"errors"
	"fmt"
	"sort"
)

// Warm restart support: a daemon that inherits the host arena of its
// predecessor (a memfd kept by systemd's fd store) re-adopts the blocks the
// predecessor left there, at the offsets they already occupy, instead of
// copying them anywhere.

// ErrAdopt reports a block that cannot be adopted at the given place: an
// offset outside the arena or not on a slot of the block's size class, a
// slab owned by another class, an occupied slot, or a key already present.
var ErrAdopt = errors.New("cannot adopt block")

// Adopt enters a committed block for key whose bytes already lie in the
// arena at [offset, offset+size), claiming that exact slot: the slab must be
// free (it is then assigned to the block's size class) or already belong to
// that class, and offset must start a free slot of it (slab base plus a
// multiple of the class stride). The block becomes most recently used, so
// adopting blocks oldest first rebuilds the recency order. Adopt never
// evicts, moves or touches block bytes; the caller verifies them.
func (h *Host) Adopt(key Key, offset, size int64) error {
	if size <= 0 {
		return ErrBadSize
	}
	if size > h.slabBytes {
		return ErrTooLarge
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if offset < 0 || offset > int64(len(h.arena)) || size > int64(len(h.arena))-offset {
		return fmt.Errorf("%w: [%d, +%d) outside the %d-byte arena", ErrAdopt, offset, size, len(h.arena))
	}
	if _, ok := h.index[key]; ok {
		return fmt.Errorf("%w: %w", ErrAdopt, ErrExists)
	}
	stride := (size + h.align - 1) / h.align * h.align
	s := &h.slabs[offset/h.slabBytes]
	within := offset - s.base
	if within%stride != 0 || within+size > h.slabBytes {
		return fmt.Errorf("%w: offset %d is not a slot of class %d (stride %d) in slab %d",
			ErrAdopt, offset, size, stride, offset/h.slabBytes)
	}
	slot := int(within / stride)
	if slot >= int(h.slabBytes/stride) {
		return fmt.Errorf("%w: offset %d lies in the tail of slab %d", ErrAdopt, offset, offset/h.slabBytes)
	}
	if s.cls != nil {
		if s.cls.size != size {
			return fmt.Errorf("%w: slab %d belongs to class %d, not %d", ErrAdopt, offset/h.slabBytes, s.cls.size, size)
		}
		if s.slots[slot] != nil {
			return fmt.Errorf("%w: slot at %d is occupied", ErrAdopt, offset)
		}
	}
	c := h.classFor(size)
	if s.cls == nil {
		h.takeFromPool(s)
		h.assignSlab(s, c)
	}
	h.claimSlot(s, slot)
	hd := &Handle{
		Key:    key,
		Offset: offset,
		Size:   size,
		host:   h,
		cls:    c,
		state:  stateCommitted,
		slab:   int32(s.base / h.slabBytes),
		slot:   int32(slot),
		parked: key.Parked(), // left by the previous process, not yet on NVMe
	}
	s.slots[slot] = hd
	h.index[key] = hd
	h.addUsed(hd)
	h.committed++
	l := h.ns[key.NS]
	if l == nil {
		l = &nsList{}
		h.ns[key.NS] = l
	}
	l.push(hd)
	hd.stamp = h.nextTick()
	c.lru.pushFront(hd)
	return nil
}

// takeFromPool removes the free slab s from the pool, keeping the order of
// the others (low addresses are handed out first).
func (h *Host) takeFromPool(s *slab) {
	for i, p := range h.pool {
		if p == s {
			copy(h.pool[i:], h.pool[i+1:])
			h.pool[len(h.pool)-1] = nil
			h.pool = h.pool[:len(h.pool)-1]
			return
		}
	}
	panic("tiers: unowned slab missing from the pool")
}

// claimSlot occupies the given free slot of s (takeSlot picks one itself).
// Slots skipped below it that were never used join the free list.
func (h *Host) claimSlot(s *slab, slot int) {
	if slot < s.bump {
		i := len(s.free) - 1
		for i >= 0 && int(s.free[i]) != slot {
			i--
		}
		if i < 0 {
			panic("tiers: vacant slot missing from the free list")
		}
		s.free[i] = s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
	} else {
		// Highest first: takeSlot pops from the end, so the lowest skipped
		// slot is reused first.
		for j := slot - 1; j >= s.bump; j-- {
			s.free = append(s.free, int32(j))
		}
		s.bump = slot + 1
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
}

// PinAllOldestFirst pins every committed block, like PinAll, and returns them
// least recently used first: the order in which Adopt rebuilds recency.
func (h *Host) PinAllOldestFirst() []*Handle {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Handle, 0, h.committed)
	for _, hd := range h.index {
		if hd.state == stateCommitted {
			out = append(out, hd)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].stamp < out[j].stamp })
	for _, hd := range out {
		h.pinLocked(hd)
	}
	return out
}
