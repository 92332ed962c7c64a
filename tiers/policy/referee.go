package policy

// referee decides Density's near ties: evictions where the sampled
// lowest-density leaf and the least recently used leaf have densities
// within a factor dTie of each other. There the learned tables rank by a
// difference smaller than their own error (on multi-turn chat, where every
// class has the same future, they rank a session's newest tail below older
// blocks, docs/policy.md), so the referee checks each such choice against
// the future: of the two candidates, the one referenced first is the one
// that should have stayed (Belady's rule for a single eviction). It keeps
// decayed counts of how often density's pick and recency's pick were the
// right one to evict, and near ties follow density only while density has
// been right more often. Both candidates are tracked whichever is evicted,
// so the count keeps measuring the rule not in force.
//
// Memory is bounded: at most len(pairs) undecided pairs (the oldest
// undecided one is dropped, counting nothing, when a new one needs its
// slot).
type referee struct {
	pairs []refPair
	next  int
	pend  map[Key][]int32 // key → slots of the undecided pairs it is in
	// decayed counts of decided near ties: density's pick referenced first
	// (wrong to evict it) or recency's pick referenced first (right)
	right, wrong float64
}

type refPair struct {
	d, r       Key   // density's pick, recency's pick
	dPos, rPos int32 // their places in pend[d] and pend[r]
	live       bool
}

// dTie is the density ratio under which the referee decides: √2, half an
// octave. Factors 2 and 4 did no better on held-out chat traces
// (docs/policy.md, "Held-out generator seeds").
const dTie = 1.4142135623730951

// init empties the referee's undecided pairs (its counts stay) and gives it
// room for slots of them.
func (f *referee) init(slots int) {
	f.pairs = make([]refPair, max(slots, 1))
	f.pend = make(map[Key][]int32)
	f.next = 0
}

// trustDensity reports whether near ties currently follow density.
func (f *referee) trustDensity() bool { return f.right > f.wrong }

// add records a near tie between density's pick d and recency's pick r.
func (f *referee) add(d, r Key) {
	i := int32(f.next)
	f.next = (f.next + 1) % len(f.pairs)
	if old := &f.pairs[i]; old.live {
		f.unlink(old.d, old.dPos)
		f.unlink(old.r, old.rPos)
	}
	f.pairs[i] = refPair{d: d, r: r, dPos: int32(len(f.pend[d])), rPos: int32(len(f.pend[r])), live: true}
	f.pend[d] = append(f.pend[d], i)
	f.pend[r] = append(f.pend[r], i)
}

// unlink removes the slot at place pos of pend[k] in O(1): the last slot
// moves into its place, and its pair learns its new place. A key can be in
// many pairs (the least recently used leaf, while it stays the oldest).
func (f *referee) unlink(k Key, pos int32) {
	l := f.pend[k]
	last := l[len(l)-1]
	l[pos] = last
	if p := &f.pairs[last]; p.d == k {
		p.dPos = pos
	} else {
		p.rPos = pos
	}
	l = l[:len(l)-1]
	if len(l) == 0 {
		delete(f.pend, k)
	} else {
		f.pend[k] = l
	}
}

// seen decides every undecided pair k is in: k is referenced before the
// other candidate.
func (f *referee) seen(k Key) {
	l, ok := f.pend[k]
	if !ok {
		return
	}
	delete(f.pend, k)
	for _, i := range l {
		p := &f.pairs[i] // live: decided and overwritten pairs leave pend
		p.live = false
		if p.d == k {
			f.wrong++
			f.unlink(p.r, p.rPos)
		} else {
			f.right++
			f.unlink(p.d, p.dPos)
		}
	}
}

func (f *referee) decay(x float64) {
	f.right *= x
	f.wrong *= x
}
