package policy

import (
	"math"
	"math/rand/v2"
)

// LRB is a learned policy in the spirit of LRB (Song et al., "Learning
// Relaxed Belady for CDN caching", NSDI'20), adapted to prefix chains and
// ranked like LHD: a gradient-boosted tree ensemble, trained online on
// per-block features, predicts for every resident leaf of the prefix tree
// how likely it is to be referenced again over successive horizons, and
// Victim evicts the sampled leaf with the lowest hit density (hits per unit
// of cache time, as in Density) computed from those predictions. It is a
// candidate, not the default: on the development trace it closes less of
// the LRU→Belady gap than Density (docs/policy.md).
//
// Features are kept per block in a keys-only history (lHistory × capacity
// entries, least recently referenced dropped first) that outlives eviction,
// as in Density, so that labels come from the workload and not from what
// the cache happened to keep. Per block, known at any moment:
//
//   - its age (references since its last reference) and time since first
//     seen, its last four inter-reference gaps, its reference count;
//   - three exponentially decayed reference counters with half-lives of 1,
//     4 and 16 cache turnovers (capacity references; LRB's EDCs);
//   - chain shape at the last reference: position, chain length, whether
//     the request had a prefix hit, whether the block was resident;
//   - prefix-tree context: the number of distinct children seen after it,
//     its parent's reference count and the parent's age.
//
// All are quantized to log-scale byte bins (two per octave), so trees split
// on small integers (the histogram algorithm of LightGBM, gbm.go).
//
// Labels are hazards with a scale-free horizon, so no memory window has to
// be chosen: at every reference one resident leaf is drawn uniformly (the
// distribution Victim decides on, as LRB samples cached objects) and its
// features at its current age a are recorded; the label is 1 if the block
// is referenced again within the next a+1 references (before its age
// doubles), else 0, read from the history whether or not the block stayed
// cached. Every capacity labelled samples the ensemble is refitted on the
// latest lTrain × capacity (32 trees of up to 32 leaves, learning rate 0.1,
// min 20 samples per leaf: LRB's and LightGBM's defaults).
//
// The pure LRB design (regress log2 of the distance to the next reference,
// censored at 2W for a memory window W, evict the largest) was implemented
// and measured first: it closed less of the gap than this ranking at
// every window tried and lost to LRU at 10,000 blocks for W ≥ 2 cache
// turnovers (docs/policy.md).
//
// Victim samples up to 64 leaves, orphans (and blocks whose parent is gone)
// first, and evicts the lowest density: with q_k the predicted hazard at
// ages a, 2a+1, 4a+3, … (lHorizons doublings, the other features aged
// accordingly), S_k the survival, density = max over K of Σ_{k≤K} S_k q_k /
// Σ_{k≤K} (S_k − S_k q_k/2)(a_{k+1} − a_k). Before the first model it is LRU
// over leaves. Admit refuses orphans only. A density is cached per block
// and recomputed only when its age crosses a bin, it is referenced, or the
// model changes.
//
// Costs: O(1) amortized per reference: history updates are map and list
// operations; each labelled sample costs its share of one training
// (trees × depth × features histogram updates, × lTrain); Victim evaluates
// at most 64 cached densities (lHorizons × 32 trees of depth ≤ 5 each when
// recomputed). The structural constants (history and training set in cache
// turnovers, horizons, sample sizes, model defaults) and their
// sensitivity are in docs/policy.md.
type LRB struct {
	capacity int
	m        map[Key]*lrbEntry
	leaves   leafSet[*lrbEntry]
	clock    uint64
	rng      *rand.Rand

	hist  map[Key]*hEntry
	hroot hEntry      // LRU list sentinel: hroot.next = most recent
	hlim  int         // history bound
	pend  [dBins]fifo // unlabelled samples, one FIFO per age bin (deadlines nearly in order)
	npend int         // samples in pend, bounded by hlim
	horiz int
	trX   [][lFeat]uint8
	trY   []float32
	trPos int // next slot in the training ring
	trNew int // labelled samples since the last fit
	trN   int // training set size
	every int // labelled samples between fits
	model *gbm
	ver   uint32
	sc    gbmScratch
	prm   gbmParams
	edcH  [lEDC]float64 // half-lives in references

	curReq  uint64
	reqSeen bool
	reqHit  bool
}

const (
	lFeat     = 16
	lEDC      = 3
	lGaps     = 4
	lHistory  = 16  // history entries per block of capacity (as Density)
	lTrain    = 4   // training set, in cache turnovers' worth of samples
	lVictims  = 64  // leaves sampled per Victim (LRB and LHD use 64)
	lNone     = 255 // bin of a missing value
	lHorizons = 12  // doublings of age over which hitDensity looks ahead
)

type lrbEntry struct {
	key Key
	leafNode[*lrbEntry]
	h    *hEntry
	last uint64
	pver uint32 // model version of pred; 0 = none
	pbin uint8  // age bin of pred
	pred float32
}

// hEntry is one block of the keys-only history.
type hEntry struct {
	key        Key
	prev, next *hEntry
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
	pend       []pendRef // its unlabelled samples
}

type lSample struct {
	x  [lFeat]uint8
	t  uint64 // taken at
	dl uint64 // deadline: reused by then or not
	y  float32
	ok bool // labelled
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
		trN:      max(lTrain*c, 1024),
		every:    max(c, 1024),
		horiz:    lHorizons,
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

// features of h at the current time.
func (p *LRB) features(h *hEntry, x *[lFeat]uint8) { p.featuresAt(h, p.clock, x) }

// featuresAt gives the features h would have at time now ≥ h.last if not
// referenced until then.
func (p *LRB) featuresAt(h *hEntry, now uint64, x *[lFeat]uint8) {
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
		for _, r := range h.pend {
			p.label(r, now)
		}
		h.pend = h.pend[:0]
	} else {
		h = &hEntry{key: k, first: now}
		p.hist[k] = h
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
	h.pend = nil // its samples expire as beyond the window
	h.parent = nil
}

// sample records the features of one uniformly drawn resident leaf.
func (p *LRB) sample() {
	if p.leaves.len() == 0 {
		return
	}
	h := p.leaves.l[p.rng.IntN(p.leaves.len())].self.h
	if h == nil || p.hist[h.key] != h {
		return // dropped from the history: its reuse would not be seen
	}
	if p.npend >= p.hlim {
		// A sample lives as long as its leaf's age: with old leaves that
		// stay in a history that never fills, samples would pile up
		// without bound.
		return
	}
	a := p.clock - h.last
	s := lSample{t: p.clock, dl: p.clock + a + 1}
	q := ageBin(a)
	p.features(h, &s.x)
	seq := p.pend[q].push(s)
	p.npend++
	if len(h.pend) == cap(h.pend) {
		// drop the references of samples already learned as misses
		live := h.pend[:0]
		for _, r := range h.pend {
			if p.pend[r.q].get(r.seq) != nil {
				live = append(live, r)
			}
		}
		h.pend = live
	}
	h.pend = append(h.pend, pendRef{uint8(q), seq})
}

// label resolves a sample with a reuse at time now.
func (p *LRB) label(r pendRef, now uint64) {
	s := p.pend[r.q].get(r.seq)
	if s == nil || s.ok {
		return // already expired
	}
	s.ok = true
	if now <= s.dl {
		s.y = 1
	}
}

// expire learns the samples whose deadline has passed.
func (p *LRB) expire() {
	for q := range p.pend {
		f := &p.pend[q]
		for f.head < len(f.s) && f.s[f.head].dl < p.clock {
			s := &f.s[f.head]
			p.learn(&s.x, s.y) // 0 unless labelled by a reuse in time
			f.pop()
			p.npend--
		}
	}
}

// pendRef names a sample: its FIFO and sequence number there.
type pendRef struct {
	q   uint8
	seq uint64
}

// fifo is a queue of samples with consecutive sequence numbers.
type fifo struct {
	s    []lSample
	head int
	next uint64 // sequence number of the next push
}

func (f *fifo) push(s lSample) uint64 {
	f.s = append(f.s, s)
	f.next++
	return f.next - 1
}

func (f *fifo) get(seq uint64) *lSample {
	base := f.next - uint64(len(f.s)-f.head)
	if seq < base || seq >= f.next {
		return nil
	}
	return &f.s[f.head+int(seq-base)]
}

func (f *fifo) pop() {
	f.s[f.head] = lSample{}
	f.head++
	if f.head > 1024 && f.head*2 > len(f.s) {
		n := copy(f.s, f.s[f.head:])
		clear(f.s[n:])
		f.s = f.s[:n]
		f.head = 0
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
	due := p.every
	if p.model == nil {
		due = min(p.every, p.trN) / 4
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
	leafInsert(&p.leaves, p.m, k, e, a)
}

// Remove implements Policy.
func (p *LRB) Remove(k Key) { leafRemove(&p.leaves, p.m, k) }

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
		e.pred = -float32(p.hitDensity(e.h))
		e.pver, e.pbin = p.ver, b
	}
	return float64(e.pred)
}

// hitDensity is LHD's hit density of h from now on, from the hazards the
// model predicts at doubling ages: the best ratio, over horizons, of the
// probability of a reuse before the horizon to the expected cache time
// spent until the reuse or the horizon.
func (p *LRB) hitDensity(h *hEntry) float64 {
	var x [lFeat]uint8
	a := p.clock - h.last
	surv, hits, cost, best := 1.0, 0.0, 0.0, 0.0
	for range p.horiz {
		p.featuresAt(h, h.last+a, &x)
		q := min(max(float64(p.model.predict(&x)), 0), 1)
		ph := surv * q
		hits += ph
		cost += (surv - ph/2) * float64(a+1)
		surv -= ph
		best = max(best, hits/cost)
		a = 2*a + 1
	}
	return best
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
func (p *LRB) Pin(k Key) { leafPin(p.m, k) }

// Unpin implements Policy.
func (p *LRB) Unpin(k Key) { leafUnpin(p.m, k) }

// Len implements Policy.
func (p *LRB) Len() int { return len(p.m) }
