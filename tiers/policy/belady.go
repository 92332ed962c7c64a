package policy

import "container/heap"

// Belady is the offline optimum MIN (Belady 1966, with bypass): on a miss in
// a full cache it keeps the blocks whose next reference is nearest and drops
// (or does not admit) the one referenced farthest in the future. It reads the
// future from a compiled Workload and must be driven by (*Workload).Simulate
// on that same workload: it advances an internal cursor on every Access and
// Admit, i.e. once per block reference. The reference sequence it optimizes
// is the one the simulator produces — every block of every request, once, in
// chain order — which yields the ceilings in shared/workloads/README.md.
// MIN maximizes block hits on that sequence; it is the customary ceiling for
// prefix hits, not a proven optimum for them.
//
// Access, Admit, Insert, Victim are O(log n) (a max-heap keyed by next use
// with lazy deletion); Remove is O(1).
type Belady struct {
	w        *Workload
	capacity int
	cur      int           // next reference index
	next     map[Key]int32 // resident block → its next reference index
	pins     map[Key]int32 // pinned resident blocks
	h        nextHeap      // (next use, key), stale entries skipped lazily
	pending  Key           // last key passed to Admit
	pendNext int32
}

// NewBelady returns the MIN oracle for w and a cache of capacity blocks (≤ 0 =
// unlimited).
func NewBelady(w *Workload, capacity int) *Belady {
	return &Belady{w: w, capacity: capacity, next: make(map[Key]int32), pins: make(map[Key]int32)}
}

// Name implements Policy.
func (p *Belady) Name() string { return "belady" }

func (p *Belady) step(k Key) int32 {
	if p.cur >= len(p.w.keys) || p.w.keys[p.cur] != k {
		panic("policy: Belady driven out of order; use (*Workload).Simulate on the workload it was built for")
	}
	nx := p.w.next[p.cur]
	p.cur++
	return nx
}

func (p *Belady) set(k Key, nx int32) {
	p.next[k] = nx
	heap.Push(&p.h, nextItem{nx, k})
}

// Access implements Policy.
func (p *Belady) Access(k Key, _ AccessInfo) {
	nx := p.step(k)
	if _, ok := p.next[k]; ok {
		p.set(k, nx)
	}
}

// top returns the valid heap entry with the farthest next use.
func (p *Belady) top() (nextItem, bool) {
	for p.h.Len() > 0 {
		it := p.h[0]
		if nx, ok := p.next[it.key]; ok && nx == it.next {
			return it, true
		}
		heap.Pop(&p.h)
	}
	return nextItem{}, false
}

// Admit implements Policy: bypass when the block's next use is no nearer
// than that of every resident block.
func (p *Belady) Admit(k Key, _ AccessInfo) bool {
	nx := p.step(k)
	p.pending, p.pendNext = k, nx
	if p.capacity <= 0 || len(p.next) < p.capacity {
		return true
	}
	if t, ok := p.top(); ok && nx >= t.next {
		return false
	}
	return true
}

// Insert implements Policy.
func (p *Belady) Insert(k Key, _ AccessInfo) {
	nx := noNext
	if k == p.pending {
		nx = p.pendNext
	}
	p.set(k, nx)
}

// Remove implements Policy.
func (p *Belady) Remove(k Key) {
	delete(p.next, k)
	delete(p.pins, k)
}

// Victim implements Policy.
func (p *Belady) Victim() (Key, bool) {
	var skipped []nextItem
	defer func() {
		for _, it := range skipped {
			heap.Push(&p.h, it)
		}
	}()
	for {
		t, ok := p.top()
		if !ok {
			return Key{}, false
		}
		if p.pins[t.key] == 0 {
			return t.key, true
		}
		skipped = append(skipped, heap.Pop(&p.h).(nextItem))
	}
}

// Pin implements Policy.
func (p *Belady) Pin(k Key) {
	if _, ok := p.next[k]; ok {
		p.pins[k]++
	}
}

// Unpin implements Policy.
func (p *Belady) Unpin(k Key) {
	if c := p.pins[k]; c > 1 {
		p.pins[k] = c - 1
	} else {
		delete(p.pins, k)
	}
}

// Len implements Policy.
func (p *Belady) Len() int { return len(p.next) }

type nextItem struct {
	next int32
	key  Key
}

type nextHeap []nextItem

func (h nextHeap) Len() int           { return len(h) }
func (h nextHeap) Less(i, j int) bool { return h[i].next > h[j].next }
func (h nextHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nextHeap) Push(x any)        { *h = append(*h, x.(nextItem)) }
func (h *nextHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}
