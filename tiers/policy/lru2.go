package policy

import "container/heap"

// LRU2 is LRU-K with K = 2 (O'Neil, O'Neil & Weikum, SIGMOD'93): it evicts
// the block whose second-most-recent reference is oldest. Blocks referenced
// only once (infinite backward 2-distance) go first, in LRU order. The
// reference history of evicted blocks is retained for capacity keys (the
// paper's retained information period), so a block that returns soon keeps
// its history. Blocks with two or more references live in a min-heap keyed
// by their penultimate reference time: Access/Insert/Victim are O(log n),
// the rest O(1).
type LRU2 struct {
	m       map[Key]*lru2Entry
	once    list // blocks with a single known reference, LRU order (front = recent)
	h       lru2Heap
	clock   uint64
	hist    map[Key]uint64 // evicted key → time of its last reference
	histQ   []histRec      // FIFO of hist records, bounded to capacity
	histPos int
	sized   bool // a Victim has been asked for: the tier was full (size.go)
}

type lru2Entry struct {
	entry
	last, penult uint64 // reference times; penult == 0: referenced once
	idx          int    // heap index, -1 when on the once list
}

// NewLRU2 returns an LRU-2 policy for capacity blocks.
func NewLRU2(capacity int) *LRU2 {
	p := &LRU2{m: make(map[Key]*lru2Entry), hist: make(map[Key]uint64), histQ: make([]histRec, max(capacity, 1))}
	p.once.init()
	return p
}

// Name implements Policy.
func (p *LRU2) Name() string { return "lru2" }

func (p *LRU2) touch(e *lru2Entry) {
	p.clock++
	e.penult, e.last = e.last, p.clock
	if e.idx < 0 {
		p.once.remove(&e.entry)
		heap.Push(&p.h, e)
	} else {
		heap.Fix(&p.h, e.idx)
	}
}

// Access implements Policy.
func (p *LRU2) Access(k Key, _ AccessInfo) {
	if e := p.m[k]; e != nil {
		p.touch(e)
	}
}

// Admit implements Policy: LRU-2 admits every block.
func (p *LRU2) Admit(Key, AccessInfo) bool { return true }

// Insert implements Policy.
func (p *LRU2) Insert(k Key, a AccessInfo) {
	if e := p.m[k]; e != nil {
		p.touch(e)
		return
	}
	p.clock++
	e := &lru2Entry{entry: entry{key: k}, last: p.clock, idx: -1}
	p.m[k] = e
	if t, ok := p.hist[k]; ok {
		delete(p.hist, k)
		e.penult = t
		heap.Push(&p.h, e)
	} else {
		p.once.pushFront(&e.entry)
	}
	if !p.sized {
		p.size(grown(len(p.histQ), len(p.m)))
	}
}

// size sets the retained history to the n blocks the tier holds
// (size.go), keeping its most recent records.
func (p *LRU2) size(n int) {
	if !resized(len(p.histQ), n) {
		return
	}
	q := make([]histRec, n)
	kept := 0
	for i := range p.histQ {
		r := p.histQ[(p.histPos+len(p.histQ)-1-i)%len(p.histQ)] // newest first
		if r.t == 0 || p.hist[r.k] != r.t {
			continue
		}
		if kept == n {
			delete(p.hist, r.k)
			continue
		}
		q[n-1-kept] = r
		kept++
	}
	copy(q, q[n-kept:]) // oldest first, from slot 0
	clear(q[kept:])
	p.histQ, p.histPos = q, kept%n
}

// Remove implements Policy: the block's last reference time is retained.
func (p *LRU2) Remove(k Key) {
	e := p.m[k]
	if e == nil {
		return
	}
	if e.idx < 0 {
		p.once.remove(&e.entry)
	} else {
		heap.Remove(&p.h, e.idx)
	}
	delete(p.m, k)
	if old := p.histQ[p.histPos]; old.t != 0 && p.hist[old.k] == old.t {
		delete(p.hist, old.k)
	}
	p.histQ[p.histPos] = histRec{k, e.last}
	p.histPos = (p.histPos + 1) % len(p.histQ)
	p.hist[k] = e.last
}

// Victim implements Policy.
func (p *LRU2) Victim() (Key, bool) {
	p.sized = true
	p.size(len(p.m))
	if e := p.once.coldestUnpinned(); e != nil {
		return e.key, true
	}
	var skipped []*lru2Entry
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
		skipped = append(skipped, heap.Pop(&p.h).(*lru2Entry))
	}
	return Key{}, false
}

// Pin implements Policy.
func (p *LRU2) Pin(k Key) {
	if e := p.m[k]; e != nil {
		e.pins++
	}
}

// Unpin implements Policy.
func (p *LRU2) Unpin(k Key) {
	if e := p.m[k]; e != nil && e.pins > 0 {
		e.pins--
	}
}

// Len implements Policy.
func (p *LRU2) Len() int { return len(p.m) }

type histRec struct {
	k Key
	t uint64
}

type lru2Heap []*lru2Entry

func (h lru2Heap) Len() int { return len(h) }
func (h lru2Heap) Less(i, j int) bool {
	if h[i].penult != h[j].penult {
		return h[i].penult < h[j].penult
	}
	return h[i].last < h[j].last
}
func (h lru2Heap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *lru2Heap) Push(x any)   { e := x.(*lru2Entry); e.idx = len(*h); *h = append(*h, e) }
func (h *lru2Heap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	e.idx = -1
	return e
}
