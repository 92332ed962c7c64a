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
	leaves leafSet[*hyEntry]
	clock  uint64
	rng    *rand.Rand
}

type hyEntry struct {
	key Key
	leafNode[*hyEntry]
	n  float64 // references since insertion
	t0 uint64  // logical insertion time
}

const hyperSample = 64

// NewHyper returns a hyperbolic leaf policy; the sampler is seeded
// deterministically so simulations are reproducible.
func NewHyper() *Hyper {
	return &Hyper{m: make(map[Key]*hyEntry), rng: rand.New(rand.NewPCG(1, 2))}
}

// Name implements Policy.
func (p *Hyper) Name() string { return "hyper" }

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
	e := &hyEntry{key: k, n: 1, t0: p.clock}
	leafInsert(&p.leaves, p.m, k, e, a)
}

// Remove implements Policy.
func (p *Hyper) Remove(k Key) { leafRemove(&p.leaves, p.m, k) }

func (p *Hyper) prio(e *hyEntry) float64 {
	if e.worthless() {
		return -1
	}
	return e.n / (float64(p.clock-e.t0) + 1)
}

// Victim implements Policy.
func (p *Hyper) Victim() (Key, bool) {
	var best *hyEntry
	bp := 0.0
	for i := range min(hyperSample, p.leaves.len()) {
		e := p.leaves.sample(i, hyperSample, p.rng)
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
func (p *Hyper) Pin(k Key) { leafPin(p.m, k) }

// Unpin implements Policy.
func (p *Hyper) Unpin(k Key) { leafUnpin(p.m, k) }

// Len implements Policy.
func (p *Hyper) Len() int { return len(p.m) }
