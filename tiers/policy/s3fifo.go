package policy

// S3FIFO is S3-FIFO (Yang et al., SOSP'23): new blocks enter a small FIFO
// (10% of capacity); a block referenced again while there is promoted to the
// main FIFO on eviction, the others leave and are remembered in a ghost FIFO
// (as many keys as the main queue holds); a block found in the ghost on
// insertion goes straight to main. Main is a FIFO with 2-bit frequencies
// reinserted while their counter is non-zero (CLOCK-like). The sizes are the
// paper's. All operations are O(1) amortized.
type S3FIFO struct {
	c, small int
	m        map[Key]*entry
	s, mq    list
	g        *ghost
	victim   Key
	victimOK bool
	sized    bool // a Victim has been asked for: the tier was full (size.go)
}

const (
	segS uint8 = iota + 1
	segM
)

// NewS3FIFO returns an S3-FIFO policy for capacity blocks.
func NewS3FIFO(capacity int) *S3FIFO {
	c := max(capacity, 1)
	p := &S3FIFO{c: c, small: max(c/10, 1), m: make(map[Key]*entry), g: newGhost(c - max(c/10, 1))}
	p.s.init()
	p.mq.init()
	return p
}

// Name implements Policy.
func (p *S3FIFO) Name() string { return "s3fifo" }

// Access implements Policy.
func (p *S3FIFO) Access(k Key, _ AccessInfo) {
	if e := p.m[k]; e != nil && e.freq < 3 {
		e.freq++
	}
}

// Admit implements Policy: S3-FIFO admits every block (into the small queue).
func (p *S3FIFO) Admit(Key, AccessInfo) bool { return true }

// Insert implements Policy.
func (p *S3FIFO) Insert(k Key, a AccessInfo) {
	if p.m[k] != nil {
		p.Access(k, a)
		return
	}
	e := &entry{key: k}
	p.m[k] = e
	if p.g.take(k) {
		e.seg = segM
		p.mq.pushFront(e)
	} else {
		e.seg = segS
		p.s.pushFront(e)
	}
	if !p.sized {
		p.size(grown(p.c, p.Len()))
	}
}

// size sets the queue sizes for the n blocks the tier holds (size.go); the
// ghost keeps its most recent keys.
func (p *S3FIFO) size(n int) {
	if !resized(p.c, n) {
		return
	}
	p.c, p.small = n, max(n/10, 1)
	p.g = p.g.resized(n - p.small)
}

// Remove implements Policy.
func (p *S3FIFO) Remove(k Key) {
	e := p.m[k]
	if e == nil {
		return
	}
	if p.victimOK && p.victim == k {
		p.victimOK = false
		if e.seg == segS {
			p.g.add(k)
		}
	}
	if e.seg == segS {
		p.s.remove(e)
	} else {
		p.mq.remove(e)
	}
	delete(p.m, k)
}

// Victim implements Policy.
func (p *S3FIFO) Victim() (Key, bool) {
	p.sized = true
	p.size(p.Len())
	// Bounded: each step either returns, promotes a small entry (at most
	// |S| times) or decrements a main counter (at most 3|M| times) or
	// rotates a pinned entry. pinnedRun counts the pinned small entries
	// rotated in a row: once every small entry has been seen pinned, the
	// victim must come from main (a small queue of leased blocks used to
	// use up the budget rotating, and no victim was found although main
	// had unpinned blocks).
	pinnedRun := 0
	for range 2 + 2*p.s.n + 5*p.mq.n {
		if p.s.n > 0 && pinnedRun < p.s.n && (p.s.n >= p.small || p.mq.n == 0) {
			e := p.s.back()
			switch {
			case e.pins > 0:
				pinnedRun++
				p.s.moveToFront(e)
			case e.freq > 0:
				pinnedRun = 0
				p.s.remove(e)
				e.seg, e.freq = segM, 0
				p.mq.pushFront(e)
			default:
				p.victim, p.victimOK = e.key, true
				return e.key, true
			}
			continue
		}
		if v, ok := p.evictMain(); ok {
			return v, true
		}
		if p.s.n == 0 {
			return Key{}, false
		}
		// Main is all pinned: fall back to the small queue.
		if e := p.s.coldestUnpinned(); e != nil {
			p.victim, p.victimOK = e.key, true
			return e.key, true
		}
		return Key{}, false
	}
	return Key{}, false
}

// evictMain runs main's CLOCK until it finds an unreferenced, unpinned block.
func (p *S3FIFO) evictMain() (Key, bool) {
	for range 4*p.mq.n + 1 {
		e := p.mq.back()
		if e == nil {
			return Key{}, false
		}
		if e.pins > 0 || e.freq > 0 {
			if e.pins == 0 {
				e.freq--
			}
			p.mq.moveToFront(e)
			continue
		}
		p.victim, p.victimOK = e.key, true
		return e.key, true
	}
	return Key{}, false
}

// Pin implements Policy.
func (p *S3FIFO) Pin(k Key) {
	if e := p.m[k]; e != nil {
		e.pins++
	}
}

// Unpin implements Policy.
func (p *S3FIFO) Unpin(k Key) {
	if e := p.m[k]; e != nil && e.pins > 0 {
		e.pins--
	}
}

// Len implements Policy.
func (p *S3FIFO) Len() int { return len(p.m) }
