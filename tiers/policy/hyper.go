package policy

import "math/rand/v2"

// Hyper is hyperbolic caching (Blankstein, Sen & Freedman, USENIX ATC'17)
// restricted, like Chain, to the leaves of the resident prefix tree, with
// orphan refusal. A block's priority is its references since insertion
// divided by its time in the cache (a logical clock counting block
// references); Victim samples 64 leaves uniformly (the paper's sample size)
// and returns the one with the lowest priority, orphans first. Every
// operation is O(1) (Victim: 64 samples). It is a candidate, not the default:
// it wins more than Chain where popularity is skewed and stable, and loses
// to LRU on recency-driven chat (see docs/policy.md).
type Hyper struct {
	m      map[Key]*hyEntry
	leaves []*hyEntry
	clock  uint64
	rng    *rand.Rand
}

type hyEntry struct {
	key      Key
	parent   *hyEntry
	children int32
	pins     int32
	li       int32   // index in leaves; -1 when not a leaf
	orphan   bool    // inserted without a resident parent
	gone     bool    // removed; children may still point at it
	n        float64 // references since insertion
	t0       uint64  // logical insertion time
}

const hyperSample = 64

// NewHyper returns a hyperbolic leaf policy; the sampler is seeded
// deterministically so simulations are reproducible.
func NewHyper() *Hyper {
	return &Hyper{m: make(map[Key]*hyEntry), rng: rand.New(rand.NewPCG(1, 2))}
}

// Name implements Policy.
func (p *Hyper) Name() string { return "hyper" }

func (p *Hyper) addLeaf(e *hyEntry) {
	e.li = int32(len(p.leaves))
	p.leaves = append(p.leaves, e)
}

func (p *Hyper) delLeaf(e *hyEntry) {
	if e.li < 0 {
		return
	}
	last := p.leaves[len(p.leaves)-1]
	p.leaves[e.li] = last
	last.li = e.li
	p.leaves = p.leaves[:len(p.leaves)-1]
	e.li = -1
}

// Access implements Policy.
func (p *Hyper) Access(k Key, _ AccessInfo) {
	p.clock++
	if e := p.m[k]; e != nil {
		e.n++
	}
}

// Admit implements Policy: refuse orphans.
func (p *Hyper) Admit(_ Key, a AccessInfo) bool {
	p.clock++
	return !a.HasParent || p.m[a.Parent] != nil
}

// Insert implements Policy.
func (p *Hyper) Insert(k Key, a AccessInfo) {
	if p.m[k] != nil {
		p.Access(k, a)
		return
	}
	e := &hyEntry{key: k, n: 1, t0: p.clock, li: -1}
	p.m[k] = e
	if a.HasParent {
		if par := p.m[a.Parent]; par != nil {
			e.parent = par
			par.children++
			p.delLeaf(par)
		} else {
			e.orphan = true
		}
	}
	p.addLeaf(e)
}

// Remove implements Policy.
func (p *Hyper) Remove(k Key) {
	e := p.m[k]
	if e == nil {
		return
	}
	delete(p.m, k)
	e.gone = true
	p.delLeaf(e)
	if par := e.parent; par != nil && !par.gone {
		par.children--
		if par.children == 0 {
			p.addLeaf(par)
		}
	}
	e.parent = nil
}

func (p *Hyper) prio(e *hyEntry) float64 {
	if e.orphan || (e.parent != nil && e.parent.gone) {
		return -1
	}
	return e.n / (float64(p.clock-e.t0) + 1)
}

// Victim implements Policy.
func (p *Hyper) Victim() (Key, bool) {
	var best *hyEntry
	bp := 0.0
	n := len(p.leaves)
	s := min(hyperSample, n)
	for i := range s {
		e := p.leaves[i]
		if s < n {
			e = p.leaves[p.rng.IntN(n)]
		}
		if e.pins > 0 {
			continue
		}
		if pr := p.prio(e); best == nil || pr < bp {
			best, bp = e, pr
		}
	}
	if best == nil {
		// Sample all pinned: scan every resident block (O(n), only when
		// leases dominate the tier).
		for _, e := range p.m {
			if e.pins == 0 {
				if pr := p.prio(e); best == nil || pr < bp {
					best, bp = e, pr
				}
			}
		}
	}
	if best == nil {
		return Key{}, false
	}
	return best.key, true
}

// Pin implements Policy.
func (p *Hyper) Pin(k Key) {
	if e := p.m[k]; e != nil {
		e.pins++
	}
}

// Unpin implements Policy.
func (p *Hyper) Unpin(k Key) {
	if e := p.m[k]; e != nil && e.pins > 0 {
		e.pins--
	}
}

// Len implements Policy.
func (p *Hyper) Len() int { return len(p.m) }
