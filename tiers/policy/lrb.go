package policy

import (
	"math"
	"math/rand/v2"
)

// LRB is a learned policy in the spirit of LRB (Song et al., "Learning
// Relaxed Belady for CDN caching", NSDI'20), adapted to prefix chains: a
// gradient-boosted tree ensemble, trained online, predicts for every
// resident leaf of the prefix tree how far in the future its next
// reference lies, and Victim evicts the sampled leaf predicted to return
// last — the choice Belady would make if the predictions were exact.
//
// Features are kept per block in a keys-only history (lHistory × capacity
// entries, least recently referenced dropped first) that outlives eviction,
// as in Density, so that the model learns the workload's reuse and not
// what the cache happened to keep. Per block, known at any moment:
//
//   - its age (references since its last reference) and time since first
//     seen, its last four inter-reference gaps, its reference count;
//   - three exponentially decayed reference counters with half-lives of 1,
//     4 and 16 cache turnovers (capacity references);
//   - chain shape at the last reference: position, chain length, whether
//     the request had a prefix hit, whether the block was resident;
//   - the number of distinct children seen after it and its parent's
//     reference count (prefix-tree context).
//
// All of them are quantized to log-scale byte bins (two per octave).
//
// Training data follow LRB: at every reference one block of the history is
// drawn uniformly and its features at that moment are recorded; the label
// is log2 of the number of references until the block is referenced again,
// or, when that does not happen within the memory window W = lWindow ×
// capacity references, log2(2W) (LRB's label for objects beyond the window).
// Labelled samples accumulate; once trainN = lTrain × capacity are ready
// (the first model after a quarter of that), the ensemble is refitted on the
// latest trainN (32 trees of up to 32 leaves, learning rate 0.1, min 20
// samples per leaf: LRB's and LightGBM's defaults).
//
// Victim samples up to 64 leaves, orphans (and blocks whose parent is gone)
// first, and evicts the one with the largest predicted log distance to its
// next reference; before the first model it is LRU over leaves. Admit
// refuses orphans only. A prediction is cached per block and recomputed only
// when its age crosses a bin, it is referenced, or the model changes.
//
// Costs: O(1) amortized per reference: history updates are map and list
// operations; each labelled sample costs its share of one training
// (trees × depth × features histogram updates); Victim does at most 64
// predictions of 32 trees of depth ≤ 5. The only structural constants are
// the memory window, history and training set sizes in cache turnovers,
// and the published model defaults; docs/policy.md shows the sensitivity.
type LRB struct {
	capacity int
	m        map[Key]*lrbEntry
	leaves   leafSet[*lrbEntry]
	clock    uint64
	rng      *rand.Rand

	hist    map[Key]*hEntry
	hroot   hEntry    // LRU list sentinel: hroot.next = most recent
	hall    []*hEntry // for uniform sampling
	hlim    int       // history bound
	win     uint64    // memory window W in references
	pend    []lSample // FIFO of unlabelled samples, in time order
	phead   int       // first live index of pend
	seqNext uint64    // sequence number of the next sample
	trX     [][lFeat]uint8
	trY     []float32
	trPos   int // next slot in the training ring
	trNew   int // labelled samples since the last fit
	trN     int // training set size
	model   *gbm
	ver     uint32
	sc      gbmScratch
	prm     gbmParams
	edcH    [lEDC]float64 // half-lives in references

	curReq  uint64
	reqSeen bool
	reqHit  bool
}

const (
	lFeat    = 16
	lEDC     = 3
	lGaps    = 4
	lHistory = 16  // history entries per block of capacity (as Density)
	lWindow  = 1   // memory window, in cache turnovers
	lTrain   = 1   // training set size, in cache turnovers' worth of samples
	lVictims = 64  // leaves sampled per Victim (LRB and LHD use 64)
	lNone    = 255 // bin of a missing value
)

type lrbEntry struct {
	key Key
	leafNode[*lrbEntry]
	h    *hEntry
	pins int32
	last uint64
	pver uint32 // model version of pred; 0 = none
	pbin uint8  // age bin of pred
	pred float32
}

// hEntry is one block of the keys-only history.
type hEntry struct {
	key        Key
	prev, next *hEntry
	si         int32 // index in hall
	first      uint64
	last       uint64
	gaps       [lGaps]uint32
	refs       uint32
	edc        [lEDC]float64 // value at time last
	pos, clen  uint16
	hitReq     bool
	resident   bool
	kids       uint32
	parRefs    uint32
	parent     *hEntry
	pend       []uint64 // sequence numbers of its unlabelled samples
}

type lSample struct {
	x   [lFeat]uint8
	t   uint64
	seq uint64
	h   *hEntry
	y   float32
	ok  bool // labelled
}

// NewLRB returns the policy for a tier of capacity blocks.
func NewLRB(capacity int) *LRB {
	c := max(capacity, 1)
	p := &LRB{
		capacity: c,
		m:        make(map[Key]*lrbEntry),
		rng:      rand.New(rand.NewPCG(5, 6)),
		hist:     make(map[Key]*hEntry),
		hlim:     lHistory * c,
		win:      uint64(lWindow * c),
		trN:      max(lTrain*c, 1024),
		prm:      gbmDefault,
	}
	p.hroot.next, p.hroot.prev = &p.hroot, &p.hroot
	for i := range p.edcH {
		p.edcH[i] = float64(c) * float64(int(1)<<(2*i))
	}
	return p
}

// Name implements Policy.
func (p *LRB) Name() string { return "lrb" }

func (p *LRB) unlink(e *hEntry) {
	e.prev.next = e.next
	e.next.prev = e.prev
}

func (p *LRB) pushFront(e *hEntry) {
	e.prev, e.next = &p.hroot, p.hroot.next
	p.hroot.next.prev = e
	p.hroot.next = e
}

// lbin quantizes v ≥ 0 to two bins per octave.
func lbin(v uint64) uint8 { return uint8(min(ageBin(v), 254)) }

// features of h at time now.
func (p *LRB) features(h *hEntry, x *[lFeat]uint8) {
	now := p.clock
	x[0] = lbin(now - h.last)
	x[1] = lbin(now - h.first)
	for i := range lGaps {
		if uint32(i) < h.refs-1 {
			x[2+i] = lbin(uint64(h.gaps[i]))
		} else {
			x[2+i] = lNone
		}
	}
	x[6] = lbin(uint64(h.refs))
	dt := float64(now - h.last)
	for i := range lEDC {
		v := h.edc[i] * math.Exp2(-dt/p.edcH[i])
		x[7+i] = uint8(min(254, int(4*math.Log2(1+8*v))))
	}
	x[10] = lbin(uint64(h.pos))
	x[11] = lbin(uint64(h.clen))
	var f uint8
	if h.hitReq {
		f |= 1
	}
	if h.resident {
		f |= 2
	}
	x[12] = f
	x[13] = lbin(uint64(h.kids))
	x[14] = lbin(uint64(h.parRefs))
	if h.parent != nil {
		x[15] = lbin(now - h.parent.last)
	} else {
		x[15] = lNone
	}
}

// observe records one reference of k in the history, labels the samples it
// resolves, takes one new sample and trains when enough are labelled.
func (p *LRB) observe(k Key, a AccessInfo, resident bool) *hEntry {
	p.clock++
	now := p.clock
	h := p.hist[k]
	if h != nil {
		g := now - h.last
		copy(h.gaps[1:], h.gaps[:lGaps-1])
		h.gaps[0] = uint32(min(g, math.MaxUint32))
		for i := range lEDC {
			h.edc[i] *= math.Exp2(-float64(g) / p.edcH[i])
		}
		p.unlink(h)
		for _, s := range h.pend {
			p.label(s, now)
		}
		h.pend = h.pend[:0]
	} else {
		h = &hEntry{key: k, first: now, si: int32(len(p.hall))}
		p.hist[k] = h
		p.hall = append(p.hall, h)
		if a.HasParent {
			if par := p.hist[a.Parent]; par != nil {
				par.kids++
			}
		}
		for len(p.hist) > p.hlim {
			p.drop(p.hroot.prev)
		}
	}
	h.refs++
	for i := range lEDC {
		h.edc[i]++
	}
	h.last = now
	h.pos, h.clen = uint16(min(a.Pos, math.MaxUint16)), uint16(min(a.ChainLen, math.MaxUint16))
	h.hitReq, h.resident = p.reqHit, resident
	h.parent = nil
	h.parRefs = 0
	if a.HasParent {
		if par := p.hist[a.Parent]; par != nil {
			h.parent, h.parRefs = par, par.refs
		}
	}
	p.pushFront(h)
	p.sample()
	p.expire()
	return h
}

// drop forgets the least recent history entry.
func (p *LRB) drop(h *hEntry) {
	p.unlink(h)
	delete(p.hist, h.key)
	last := p.hall[len(p.hall)-1]
	p.hall[h.si] = last
	last.si = h.si
	p.hall = p.hall[:len(p.hall)-1]
	h.pend = nil // its samples expire as beyond the window
	h.parent = nil
}

// sample records the features of one uniformly drawn history block.
func (p *LRB) sample() {
	if len(p.hall) == 0 {
		return
	}
	h := p.hall[p.rng.IntN(len(p.hall))]

	seq := p.seqNext
	p.seqNext++
	s := lSample{t: p.clock, seq: seq, h: h}
	p.features(h, &s.x)
	p.pend = append(p.pend, s)
	h.pend = append(h.pend, seq)
}

// seqBase is the sequence number of pend[phead]; sequence numbers are
// consecutive in pend.
func (p *LRB) seqBase() uint64 { return p.seqNext - uint64(len(p.pend)-p.phead) }

// label resolves sample seq with a reuse at time now.
func (p *LRB) label(seq, now uint64) {
	base := p.seqBase()
	if seq < base || p.phead >= len(p.pend) {
		return // already expired
	}
	i := p.phead + int(seq-base)
	if i >= len(p.pend) || p.pend[i].ok {
		return
	}
	s := &p.pend[i]
	s.ok = true
	s.y = float32(math.Log2(float64(now - s.t)))
}

// expire moves samples older than the window out of the FIFO, labelling
// the unresolved ones as beyond the window.
func (p *LRB) expire() {
	for p.phead < len(p.pend) && p.pend[p.phead].t+p.win <= p.clock {
		s := &p.pend[p.phead]
		if !s.ok {
			s.y = float32(math.Log2(float64(2 * p.win)))
		}
		p.learn(&s.x, s.y)
		*s = lSample{}
		p.phead++
	}
	if p.phead > 1024 && p.phead*2 > len(p.pend) {
		n := copy(p.pend, p.pend[p.phead:])
		clear(p.pend[n:])
		p.pend = p.pend[:n]
		p.phead = 0
	}
}

// learn adds one labelled sample and refits the model when due.
func (p *LRB) learn(x *[lFeat]uint8, y float32) {
	if len(p.trX) < p.trN {
		p.trX = append(p.trX, *x)
		p.trY = append(p.trY, y)
	} else {
		p.trX[p.trPos], p.trY[p.trPos] = *x, y
	}
	p.trPos = (p.trPos + 1) % p.trN
	p.trNew++
	due := p.trN
	if p.model == nil {
		due = p.trN / 4
	}
	if p.trNew >= due {
		if g := fitGBM(p.trX, p.trY, p.prm, &p.sc); g != nil {
			p.model = g
			p.ver++
		}
		p.trNew = 0
	}
}

// begin tracks whether the current request's head block was resident.
func (p *LRB) begin(a AccessInfo, hit bool) {
	if !p.reqSeen || a.Request != p.curReq {
		p.reqSeen, p.curReq, p.reqHit = true, a.Request, hit && a.Pos == 0
	}
}

// Access implements Policy.
func (p *LRB) Access(k Key, a AccessInfo) {
	p.begin(a, true)
	h := p.observe(k, a, true)
	if e := p.m[k]; e != nil {
		e.h, e.last, e.pver = h, p.clock, 0
	}
}

// Admit implements Policy.
func (p *LRB) Admit(k Key, a AccessInfo) bool {
	p.begin(a, false)
	p.observe(k, a, false)
	return !a.HasParent || p.m[a.Parent] != nil
}

// Insert implements Policy.
func (p *LRB) Insert(k Key, a AccessInfo) {
	if p.m[k] != nil {
		return
	}
	e := &lrbEntry{key: k, last: p.clock, h: p.hist[k]}
	p.m[k] = e
	var par *leafNode[*lrbEntry]
	orphan := false
	if a.HasParent {
		if pe := p.m[a.Parent]; pe != nil {
			par = &pe.leafNode
		} else {
			orphan = true
		}
	}
	p.leaves.insert(e, &e.leafNode, par, orphan)
}

// Remove implements Policy.
func (p *LRB) Remove(k Key) {
	e := p.m[k]
	if e == nil {
		return
	}
	delete(p.m, k)
	p.leaves.remove(&e.leafNode)
}

// score is the eviction priority of e: larger = evict first.
func (p *LRB) score(e *lrbEntry) float64 {
	if e.worthless() {
		return math.Inf(1)
	}
	age := p.clock - e.last
	if p.model == nil || e.h == nil {
		return math.Log2(float64(age) + 1)
	}
	b := lbin(age)
	if e.pver != p.ver || e.pbin != b {
		var x [lFeat]uint8
		p.features(e.h, &x)
		e.pred, e.pver, e.pbin = p.model.predict(&x), p.ver, b
	}
	return float64(e.pred)
}

// Victim implements Policy.
func (p *LRB) Victim() (Key, bool) {
	var best *lrbEntry
	bs, ba := 0.0, uint64(0)
	for i := range min(lVictims, p.leaves.len()) {
		e := p.leaves.sample(i, lVictims, p.rng)
		if e.pins > 0 {
			continue
		}
		s, age := p.score(e), p.clock-e.last
		if best == nil || s > bs || (s == bs && age > ba) {
			best, bs, ba = e, s, age
		}
	}
	if best == nil {
		for _, e := range p.m {
			if e.pins == 0 && (best == nil || p.score(e) > p.score(best)) {
				best = e
			}
		}
	}
	if best == nil {
		return Key{}, false
	}
	return best.key, true
}

// Pin implements Policy.
func (p *LRB) Pin(k Key) {
	if e := p.m[k]; e != nil {
		e.pins++
	}
}

// Unpin implements Policy.
func (p *LRB) Unpin(k Key) {
	if e := p.m[k]; e != nil && e.pins > 0 {
		e.pins--
	}
}

// Len implements Policy.
func (p *LRB) Len() int { return len(p.m) }
