package policy

// ReuseOracle is an offline bound, not a policy for the daemon: it knows for
// every reference whether the block will ever be referenced again, but not
// when. It refuses such dead blocks
// at admission, evicts a resident block as soon as it is known dead, and
// otherwise evicts like Chain (least recently used leaf, orphans refused).
//
// It answers a design question Belady cannot: how much of the LRU→Belady gap
// a perfect predictor of reuse (the target of admission filters, frequency
// sketches and learned dead-block predictors) could close, as opposed to one
// that also knows reuse timing. On the development trace at 2,000 blocks it
// closes about a quarter of the gap (docs/policy.md), so a policy closing a
// third there must predict when blocks return, not only whether.
//
// Like Belady it must be driven by (*Workload).Simulate on the workload it
// was built for.
type ReuseOracle struct {
	w     *Workload
	cur   int
	c     *Chain
	dead  map[Key]uint64 // resident blocks with no reuse ahead → death sequence
	deadQ []deadItem     // in order of death; stale items skipped lazily
	seq   uint64
}

type deadItem struct {
	key Key
	seq uint64
}

// NewReuseOracle returns the oracle for w.
func NewReuseOracle(w *Workload) *ReuseOracle {
	return &ReuseOracle{w: w, c: NewChain(0), dead: make(map[Key]uint64)}
}

// Name implements Policy.
func (p *ReuseOracle) Name() string { return "reuse-oracle" }

// step advances the cursor and reports whether k is dead after this
// reference.
func (p *ReuseOracle) step(k Key) bool {
	if p.cur >= len(p.w.keys) || p.w.keys[p.cur] != k {
		panic("policy: ReuseOracle driven out of order; use (*Workload).Simulate on the workload it was built for")
	}
	dead := p.w.next[p.cur] == noNext
	p.cur++
	return dead
}

// Access implements Policy.
func (p *ReuseOracle) Access(k Key, a AccessInfo) {
	dead := p.step(k)
	p.c.Access(k, a)
	if _, ok := p.c.m[k]; !ok {
		return
	}
	if dead {
		p.seq++
		p.dead[k] = p.seq
		p.deadQ = append(p.deadQ, deadItem{k, p.seq})
	} else {
		delete(p.dead, k)
	}
}

// Admit implements Policy.
func (p *ReuseOracle) Admit(k Key, a AccessInfo) bool {
	dead := p.step(k)
	ok := p.c.Admit(k, a)
	return ok && !dead
}

// Insert implements Policy.
func (p *ReuseOracle) Insert(k Key, a AccessInfo) { p.c.Insert(k, a) }

// Remove implements Policy.
func (p *ReuseOracle) Remove(k Key) {
	delete(p.dead, k)
	p.c.Remove(k)
}

// Victim implements Policy: the earliest-dead unpinned block first, else
// Chain's choice.
func (p *ReuseOracle) Victim() (Key, bool) {
	live := 0 // deadQ[:live] keeps the valid items scanned past (pinned)
	for i, it := range p.deadQ {
		if s, ok := p.dead[it.key]; !ok || s != it.seq {
			continue
		}
		if e := p.c.m[it.key]; e != nil && e.pins == 0 {
			p.deadQ = append(p.deadQ[:live], p.deadQ[i:]...)
			return it.key, true
		}
		p.deadQ[live] = it
		live++
	}
	p.deadQ = p.deadQ[:live]
	return p.c.Victim()
}

// Pin implements Policy.
func (p *ReuseOracle) Pin(k Key) { p.c.Pin(k) }

// Unpin implements Policy.
func (p *ReuseOracle) Unpin(k Key) { p.c.Unpin(k) }

// Len implements Policy.
func (p *ReuseOracle) Len() int { return p.c.Len() }
