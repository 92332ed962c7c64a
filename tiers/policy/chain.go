package policy

import "container/heap"

// Chain is least-recently-used eviction restricted
// to the leaves of the prefix tree formed by the resident blocks, plus
// refusal of orphans.
//
// Lookup stops at the first missing block, so a resident block whose parent
// is gone can serve no hit until the parent comes back; and every reference
// to a block is also a reference to all its ancestors (the engine looks the
// chain up from its head). Resident blocks therefore form a forest in which
// a block is at least as valuable as any of its descendants. Plain LRU
// ignores this: within one request it touches the head first, so the head
// is the chain's least recent block and is evicted first, orphaning the whole
// rest of the chain, which then occupies the cache without ever being hit.
//
// Chain keeps the tree invariant instead:
//
//   - Victim only returns leaves (resident blocks with no resident child),
//     the least recently referenced first. A prefix shared by several
//     branches stays while any branch is recent; a branch is evicted from
//     its tail toward the fork point, never from the middle.
//   - Admit refuses a block whose parent is not resident (it could only
//     become useful after the parent is re-admitted and would displace a
//     block that can be hit now). A head block (Pos 0) is always admitted.
//   - A block whose parent is removed by the tier (Delete, demotion) is an
//     orphan and is evicted before any other leaf.
//
// Costs: Access, Insert, Remove and Victim are O(log L) where L is the
// number of resident leaves (a binary heap keyed by last reference); Admit
// is O(1). Memory: one heap slot and ~80 bytes per resident block. Pinned
// leaves met at the top of the heap are set aside during one Victim call
// and restored before it returns; if every leaf is pinned, Victim falls
// back to scanning all resident blocks (O(n), only reachable when the tier
// is full of leased blocks).
type Chain struct {
	m     map[Key]*chainEntry
	h     chainHeap // leaves, least recent on top
	clock uint64
}

type chainEntry struct {
	key      Key
	parent   *chainEntry
	children int32
	pins     int32
	idx      int32  // heap index; -1 when not a leaf
	orphan   bool   // inserted without a resident parent
	gone     bool   // removed; children may still point at it
	last     uint64 // logical time of the last reference
	// resident children, linked through prev/nextSib, so that removing a
	// block can orphan them
	firstKid, prevSib, nextSib *chainEntry
}

// NewChain returns the policy. capacity is accepted for symmetry
// with the other constructors; Chain has no size-dependent parameter.
func NewChain(capacity int) *Chain {
	_ = capacity
	return &Chain{m: make(map[Key]*chainEntry)}
}

// Name implements Policy.
func (p *Chain) Name() string { return "chain" }

// Access implements Policy.
func (p *Chain) Access(k Key, _ AccessInfo) {
	p.clock++
	if e := p.m[k]; e != nil {
		e.last = p.clock
		if e.idx >= 0 {
			heap.Fix(&p.h, int(e.idx))
		}
	}
}

// Admit implements Policy: refuse orphans.
func (p *Chain) Admit(_ Key, a AccessInfo) bool {
	p.clock++
	return !a.HasParent || p.m[a.Parent] != nil
}

// Insert implements Policy.
func (p *Chain) Insert(k Key, a AccessInfo) {
	if p.m[k] != nil {
		p.Access(k, a)
		return
	}
	e := &chainEntry{key: k, idx: -1, last: p.clock}
	p.m[k] = e
	if a.HasParent {
		if par := p.m[a.Parent]; par != nil {
			e.parent = par
			par.children++
			e.nextSib = par.firstKid
			if par.firstKid != nil {
				par.firstKid.prevSib = e
			}
			par.firstKid = e
			if par.idx >= 0 {
				heap.Remove(&p.h, int(par.idx))
			}
		} else {
			e.orphan = true
		}
	}
	heap.Push(&p.h, e)
}

// Remove implements Policy.
func (p *Chain) Remove(k Key) {
	e := p.m[k]
	if e == nil {
		return
	}
	delete(p.m, k)
	e.gone = true
	if e.idx >= 0 {
		heap.Remove(&p.h, int(e.idx))
	}
	if par := e.parent; par != nil && !par.gone {
		if e.prevSib != nil {
			e.prevSib.nextSib = e.nextSib
		} else if par.firstKid == e {
			par.firstKid = e.nextSib
		}
		if e.nextSib != nil {
			e.nextSib.prevSib = e.prevSib
		}
		par.children--
		if par.children == 0 {
			heap.Push(&p.h, par)
		}
	}
	// Its resident children can serve no hit now: orphans, evicted first.
	for c := e.firstKid; c != nil; {
		next := c.nextSib
		c.orphan, c.parent, c.prevSib, c.nextSib = true, nil, nil, nil
		if c.idx >= 0 {
			heap.Fix(&p.h, int(c.idx))
		}
		c = next
	}
	e.parent, e.firstKid, e.prevSib, e.nextSib = nil, nil, nil, nil // do not keep removed blocks alive
}

// Victim implements Policy.
func (p *Chain) Victim() (Key, bool) {
	var skipped []*chainEntry
	defer func() {
		for _, e := range skipped {
			heap.Push(&p.h, e)
		}
	}()
	for p.h.Len() > 0 {
		e := p.h[0]
		if e.pins == 0 {
			return e.key, true
		}
		skipped = append(skipped, heap.Pop(&p.h).(*chainEntry))
	}
	// Every leaf is pinned: any unpinned block will do (its pinned
	// descendants keep their bytes; the tier only loses a future hit).
	var best *chainEntry
	for _, e := range p.m {
		if e.pins == 0 && (best == nil || e.last < best.last) {
			best = e
		}
	}
	if best == nil {
		return Key{}, false
	}
	return best.key, true
}

// Pin implements Policy.
func (p *Chain) Pin(k Key) {
	if e := p.m[k]; e != nil {
		e.pins++
	}
}

// Unpin implements Policy.
func (p *Chain) Unpin(k Key) {
	if e := p.m[k]; e != nil && e.pins > 0 {
		e.pins--
	}
}

// Len implements Policy.
func (p *Chain) Len() int { return len(p.m) }

type chainHeap []*chainEntry

func (h chainHeap) Len() int { return len(h) }
func (h chainHeap) Less(i, j int) bool {
	// Orphans first, then least recent.
	if h[i].orphan != h[j].orphan {
		return h[i].orphan
	}
	return h[i].last < h[j].last
}
func (h chainHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = int32(i), int32(j)
}
func (h *chainHeap) Push(x any) { e := x.(*chainEntry); e.idx = int32(len(*h)); *h = append(*h, e) }
func (h *chainHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	e.idx = -1
	return e
}
