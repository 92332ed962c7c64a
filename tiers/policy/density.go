package policy

import (
	"container/heap"
	"math"
	"math/bits"
	"math/rand/v2"
)

// Density is the default policy: least hit density (LHD, Beckmann, Chen &
// Cidon, NSDI'18) on the leaves of the resident prefix tree, with the
// reuse statistics learned online from a keys-only history that outlives
// eviction.
//
// Every reference of a block is recorded in a bounded history (keys, no
// data; 16 × capacity entries, oldest dropped first) whether or not the
// block is cached, so the reuse gaps it learns are those of the workload,
// not of what the cache happened to keep: with a small cache most reuse
// gaps are several times the cache's residency time and a policy that only
// learns from its own hits (plain LHD) never sees them. Each reference puts
// the block in a class known at that moment:
//
//   - first reference: whether the request had a prefix hit (its head block
//     was resident) × ⌊log2 chain length⌋;
//   - later references: reference count 2, 3 or ≥ 4 (the count survives
//     eviction in the history).
//
// Per class, the reuse-gap distribution is estimated with Kaplan–Meier
// (reuses are events; blocks dropped from the history or still waiting are
// right-censored), in log-spaced age bins, with counters decayed by 5% per
// capacity references so that the estimate follows a changing workload.
// Each bin's hazard is shrunk towards that of the class's group (cold first
// references, first references after a hit, reused blocks) with the weight
// of 16 references at risk, so that a class seen a handful of times at some
// age follows its group instead of the noise of those few events.
// From it, for every age a, the hit density is the best ratio, over
// horizons T > a, of the probability of a reuse in (a, T] to the expected
// cache time spent until the reuse or T. Victim samples up to 64 leaves and
// picks the one with the lowest density at its current age (interpolated
// in log age), orphans first; Admit refuses orphans only (a learned
// admission threshold added nothing in the measurements).
//
// Near ties go to a referee (referee.go): when the least recently used
// leaf (kept exactly, in a heap) has a density within a factor √2 of the
// pick's, the tables are not trusted blindly. Each such eviction is
// recorded as a pair, and whichever of the two blocks is referenced first
// shows which should have stayed; near ties follow density only while its
// picks have been right more often than recency's (decayed like the
// tables), and recency otherwise. Where classes carry no signal (multi-turn
// chat, where every class has the same future) this stops the tables'
// estimation error from ranking a live session's newest blocks below
// older ones.
//
// For its first capacity evictions, while the tables are young, Density
// evicts as Chain does (orphans first, then the least recently used leaf).
//
// The capacity passed to NewDensity is a hint: every size-dependent
// parameter follows the number of blocks the tier actually holds once it is
// full (calibrate), since a tier sized in bytes cannot know its size in
// blocks before clients have stored them.
//
// Costs: history and class updates are map and list operations; every
// capacity references the tables are recomputed, which costs one pass over
// the history (16 × capacity entries) and O(classes × bins²), i.e. O(1) per
// reference amortized; the age heap makes Insert, Remove and a hit on a
// leaf O(log L) for L resident leaves; the referee is O(1) per reference
// and holds at most capacity undecided pairs. It closes more of the
// LRU→Belady gap than Chain on every trace (docs/policy.md), but can still
// lose to LRU: up to 0.0014 of hit ratio in roomy caches of multi-turn chat,
// where only recency carries signal ("Held-out generator seeds"), and up to
// 0.0054 at some sizes of traces whose hits come in whole repeated prompts,
// where a size's result is the balance of a few dozen chains kept or
// dropped ("Quarter-octave sweep").
type Density struct {
	capacity int
	m        map[Key]*dEntry
	leaves   leafSet[*dEntry]
	clock    uint64
	rng      *rand.Rand

	tr       tracker
	st       [dClasses]classStats
	dens     [dClasses][dBins]float64
	nextConf uint64
	period   uint64

	// request state, to derive whether the current request had a prefix hit
	curReq  uint64
	reqSeen bool
	reqHit  bool // the request's head block was resident

	// reclass, when set (simulator experiments only), replaces the class of
	// each reference, in reference order: it measures how good a class
	// predictor would have to be (TestPredictorQualityNeeded).
	reclass func(uint16) uint16

	// norm measures ages of reused blocks in units of the block's own mean
	// inter-reference gap (experiment, not the default: docs/policy.md).
	norm  bool
	first map[Key]uint64 // norm: clock of each history key's first reference

	// trueGap and deadAt, when set (simulator diagnostics only, TestExp),
	// inject future knowledge: trueGap replaces norm's estimated mean gap by
	// the block's mean gap over its whole life; deadAt(i) tells whether the
	// reference at clock i is the block's last, which makes the block
	// worthless (evicted first, refused at admission).
	trueGap func(Key) float64
	deadAt  func(i uint64) bool

	// shrink is the weight, in references at risk, of the class group's
	// pooled hazard in each class's estimate (dShrink; 0 turns pooling off,
	// for experiments).
	shrink float64

	// byAge holds the leaves, least recently referenced on top, so that
	// the least recently used leaf is known exactly; ref decides near ties
	// between it and density's pick.
	byAge dHeap
	ref   referee
	noRef bool // experiments: density decides near ties too

	// evictions counts Victim's picks up to capacity. Until the cache has
	// turned over once, the tables hold few reuses at the ages a full
	// cache evicts at, so eviction follows recency as chain's does (orphans
	// first, then the least recently used leaf): on roomy caches that turn
	// over only a few times in a trace, young tables lost up to 0.0076 of
	// hit ratio to LRU (docs/policy.md, "Warm-up").
	evictions int
	noWarm    bool // experiments: the tables decide from the first eviction

	sized       bool // a Victim has been asked for: the tier was full (calibrate)
	noCalibrate bool // experiments: keep NewDensity's capacity (calibrate)
}

type dEntry struct {
	key Key
	leafNode[*dEntry]
	last uint64
	cls  uint16
	dead bool    // deadAt diagnostics only
	mul  float32 // norm's age multiplier (1 otherwise); these three share a word
	hi   int32   // index in Density.byAge; -1 when not a leaf
}

const (
	dRefB    = 3  // reference-count classes of reused blocks: 2, 3, 4+
	dLenB    = 12 // ⌊log2 chain length⌋ classes of first references
	dClasses = 2*dLenB + dRefB
	dBins    = 2*40 + 2 // age bins: two per octave up to 2^40 references
	dHistory = 16       // history entries per block of capacity
	dDecay   = 0.95     // counter decay per capacity references
	dSample  = 64       // leaves sampled per Victim (LHD's sample size)
	dShrink  = 16       // pseudo-references of the group's hazard per class and age bin
	dGroups  = 3        // class groups pooled for shrinkage: cold first, hit first, reused
)

type classStats struct {
	hits [dBins]float64 // reuses observed with gap in bin
	cens [dBins]float64 // tracking dropped (censored) at age in bin
	live [dBins]float64 // scratch: live tracker entries by age bin
}

func ageBin(a uint64) int {
	// two bins per octave: bin = 2*log2(a+1) rounded down, by the top two bits
	x := a + 1
	l := bits.Len64(x) - 1 // floor log2
	half := 0
	if l > 0 && (x>>(l-1))&1 == 1 {
		half = 1
	}
	b := 2*l + half
	if b >= dBins {
		b = dBins - 1
	}
	return b
}

// binLo returns the smallest age in bin b (0 ≤ b ≤ dBins).
func binLo(b int) float64 { return binLos[b] }

// binLos and logBinLos hold, for every bin boundary b, the smallest age in
// bin b and the logarithm of one more than it: densAt interpolates in log
// age for each of the 64 leaves a victim samples, and recomputing the
// boundaries' logarithms there was two thirds of density's cost per
// operation (BenchmarkOps).
var binLos, logBinLos = binTables()

func binTables() (lo, logLo [dBins + 1]float64) {
	for b := range lo {
		x := math.Ldexp(1, b/2)
		if b%2 == 1 {
			x *= 1.5
		}
		lo[b] = x - 1
		logLo[b] = math.Log(lo[b] + 1)
	}
	return lo, logLo
}

// classGroup returns the group whose pooled hazard c's estimate shrinks
// towards: first references of cold requests, first references after a
// prefix hit, and reused blocks.
func classGroup(c int) int {
	switch {
	case c < dLenB:
		return 0
	case c < 2*dLenB:
		return 1
	}
	return 2
}

func classOf(refs int, hitReq bool, chainLen int) uint16 {
	if refs <= 1 {
		h := 0
		if hitReq {
			h = 1
		}
		lb := min(bits.Len(uint(max(chainLen, 1))), dLenB) - 1
		return uint16(h*dLenB + lb)
	}
	return uint16(2*dLenB + min(refs, dRefB+1) - 2)
}

// tracker remembers recent references (keys only) to learn reuse gaps per
// class, independent of what the cache holds.
type tracker struct {
	m     map[Key]*tEntry
	root  tEntry // list sentinel: root.next = most recent
	limit int
}

type tEntry struct {
	key        Key
	prev, next *tEntry
	last       uint64
	mul        float32
	cls        uint16
	refs       int
}

func (t *tracker) init(limit int) {
	t.m = make(map[Key]*tEntry)
	t.root.next, t.root.prev = &t.root, &t.root
	t.limit = limit
}

func (t *tracker) unlink(e *tEntry) {
	e.prev.next = e.next
	e.next.prev = e.prev
}

func (t *tracker) pushFront(e *tEntry) {
	e.prev, e.next = &t.root, t.root.next
	t.root.next.prev = e
	t.root.next = e
}

// NewDensity returns the policy for a tier of capacity blocks.
func NewDensity(capacity int) *Density {
	p := &Density{capacity: max(capacity, 1), m: make(map[Key]*dEntry), rng: rand.New(rand.NewPCG(3, 4)), shrink: dShrink}
	p.tr.init(dHistory * p.capacity)

	p.period = uint64(p.capacity)
	p.nextConf = 256
	p.ref.init(p.capacity)
	return p
}

// syncAge brings e's membership of byAge in line with whether it is a
// leaf now (leafSet's index li).
func (p *Density) syncAge(e *dEntry) {
	switch {
	case e.li >= 0 && e.hi < 0:
		heap.Push(&p.byAge, e)
	case e.li < 0 && e.hi >= 0:
		heap.Remove(&p.byAge, int(e.hi))
	}
}

// Name implements Policy.
func (p *Density) Name() string { return "density" }

// enableNorm turns on the norm experiment (docs/policy.md, "Per-block
// reference rate"); call it before the first reference.
func (p *Density) enableNorm() {
	p.norm = true
	p.first = make(map[Key]uint64)
}

// observe records one reference of k in the tracker and returns its
// tracker entry (the block's class and age multiplier after this reference).
func (p *Density) observe(k Key, a AccessInfo) *tEntry {
	p.clock++
	p.ref.seen(k)

	t := &p.tr
	e := t.m[k]
	if e != nil {
		g := p.clock - e.last
		p.st[e.cls].hits[ageBin(uint64(float64(g)*float64(e.mul)))]++
		t.unlink(e)
		e.refs++
	} else {
		e = &tEntry{key: k, refs: 1}
		t.m[k] = e
		if p.norm {
			p.first[k] = p.clock
		}
		p.trim()
	}
	e.last = p.clock
	e.cls = classOf(e.refs, p.reqHit, a.ChainLen)
	e.mul = 1
	if p.norm && e.refs >= 2 {
		g := float64(p.clock-p.first[k]) / float64(e.refs-1)
		if p.trueGap != nil {
			g = p.trueGap(k)
		}
		e.mul = float32(normK / max(g, 1))
	}
	if p.reclass != nil {
		e.cls = p.reclass(e.cls)
	}
	t.pushFront(e)
	if p.clock >= p.nextConf {
		p.reconfigure()
		p.nextConf = p.clock + p.period
	}
	return e
}

// trim drops the oldest history entries above the limit; each is censored
// at its age.
func (p *Density) trim() {
	t := &p.tr
	for len(t.m) > t.limit {
		old := t.root.prev
		t.unlink(old)
		delete(t.m, old.key)
		delete(p.first, old.key)
		p.st[old.cls].cens[ageBin(uint64(float64(p.clock-old.last)*float64(old.mul)))]++
	}
}

func (p *Density) reconfigure() {
	for c := range p.st {
		clear(p.st[c].live[:])
	}
	for e := p.tr.root.next; e != &p.tr.root; e = e.next {
		p.st[e.cls].live[ageBin(uint64(float64(p.clock-e.last)*float64(e.mul)))]++
	}
	// risk[c][b]: class c's references at risk at the start of bin b
	// (reused, censored or still waiting at an age in bin b or later).
	var risk [dClasses][dBins]float64
	for c := range p.st {
		s, r := &p.st[c], 0.0
		for b := dBins - 1; b >= 0; b-- {
			r += s.hits[b] + s.cens[b] + s.live[b]
			risk[c][b] = r
		}
	}
	pool := p.pooledHazards(&risk)
	for c := range p.st {
		s := &p.st[c]
		g := &pool[classGroup(c)]
		var haz [dBins]float64
		top := -1
		for b := dBins - 1; b >= 0; b-- {
			if d := risk[c][b] + p.shrink; d > 0 {
				haz[b] = (s.hits[b] + p.shrink*g[b]) / d
			}
			if top < 0 && haz[b] > 0 {
				top = b
			}
		}
		// survival at the start of each bin
		var surv [dBins + 1]float64
		surv[0] = 1
		for b := 0; b < dBins; b++ {
			surv[b+1] = surv[b] * (1 - haz[b])
		}
		for i := 0; i < dBins; i++ {
			best := 0.0
			if i <= top && surv[i] > 0 {
				hits, cost := 0.0, 0.0
				for j := i; j <= top; j++ {
					w := binLo(j+1) - binLo(j)
					ph := surv[j] * haz[j]
					hits += ph
					cost += (surv[j] - ph/2) * w
					if cost > 0 && hits/cost > best {
						best = hits / cost
					}
				}
			}
			p.dens[c][i] = best
		}
		// decay
		for b := range s.hits {
			s.hits[b] *= dDecay
			s.cens[b] *= dDecay
		}
	}
	p.ref.decay(dDecay)
}

// pooledHazards returns, per class group and age bin, the Kaplan–Meier
// hazard of all the group's classes together, from each class's references
// at risk per bin (risk). Each class's hazard is
// shrunk towards it with the weight of p.shrink references at risk
// (empirical Bayes): a class with few references in a bin, typically at
// long ages or in a rare chain-length class, then follows its group rather
// than the noise of a handful of events, while a class with many keeps its
// own estimate.
func (p *Density) pooledHazards(risk *[dClasses][dBins]float64) [dGroups][dBins]float64 {
	var out [dGroups][dBins]float64
	if p.shrink == 0 {
		return out
	}
	var hits, at [dGroups][dBins]float64
	for c := range p.st {
		g := classGroup(c)
		for b := range dBins {
			hits[g][b] += p.st[c].hits[b]
			at[g][b] += risk[c][b]
		}
	}
	for g := range out {
		for b := range out[g] {
			if at[g][b] > 0 {
				out[g][b] = hits[g][b] / at[g][b]
			}
		}
	}
	return out
}

// Access implements Policy.
func (p *Density) Access(k Key, a AccessInfo) {
	p.begin(a, true)
	t := p.observe(k, a)
	if e := p.m[k]; e != nil {
		e.last = p.clock
		if e.hi >= 0 {
			heap.Fix(&p.byAge, int(e.hi))
		}
		e.cls, e.mul = t.cls, t.mul
		e.dead = p.deadAt != nil && p.deadAt(p.clock-1)
	}
}

// begin tracks whether the current request's head block was resident.
func (p *Density) begin(a AccessInfo, hit bool) {
	if !p.reqSeen || a.Request != p.curReq {
		p.reqSeen, p.curReq, p.reqHit = true, a.Request, hit && a.Pos == 0
	}
}

func (p *Density) density(e *dEntry) float64 {
	if e.worthless() || e.dead {
		return -1
	}
	m := float64(e.mul)
	return p.densAt(e.cls, uint64(float64(p.clock-e.last)*m)) * m
}

// normK maps norm's ages (in mean gaps) onto the integer age bins: one mean
// gap is age 256, so the bins resolve fractions of a gap.
const normK = 256

// densAt interpolates the class's density table linearly in log age.
func (p *Density) densAt(c uint16, age uint64) float64 {
	b := ageBin(age)
	if b >= dBins-1 {
		return p.dens[c][b]
	}
	lo, hi := logBinLos[b], logBinLos[b+1]
	f := (math.Log(float64(age)+1) - lo) / (hi - lo)
	// values are attached to bin centres
	f -= 0.5
	if f < 0 {
		if b == 0 {
			return p.dens[c][0]
		}
		return p.dens[c][b]*(1+f) + p.dens[c][b-1]*(-f)
	}
	return p.dens[c][b]*(1-f) + p.dens[c][b+1]*f
}

// Admit implements Policy.
func (p *Density) Admit(k Key, a AccessInfo) bool {
	p.begin(a, false)
	p.observe(k, a)
	if p.deadAt != nil && p.deadAt(p.clock-1) {
		return false
	}
	return !a.HasParent || p.m[a.Parent] != nil
}

func (p *Density) pick() *dEntry {
	var best *dEntry
	bp, ba := 0.0, uint64(0)
	for i := range min(dSample, p.leaves.len()) {
		e := p.leaves.sample(i, dSample, p.rng)
		if e.pins > 0 {
			continue
		}
		pr := p.density(e)
		age := p.clock - e.last
		if best == nil || pr < bp || (pr == bp && age > ba) {
			best, bp, ba = e, pr, age
		}
	}
	if best == nil || bp < 0 {
		return best
	}
	if p.evictions < p.capacity && !p.noWarm {
		p.evictions++
		if p.byAge.Len() > 0 && p.byAge[0].pins == 0 {
			return p.byAge[0]
		}
		return best
	}
	if p.noRef {
		return best
	}
	// A near tie with the least recently used leaf goes to the referee.
	if p.byAge.Len() == 0 {
		return best
	}
	old := p.byAge[0]
	if old.pins > 0 || old == best {
		return best
	}
	op := p.density(old)
	if op < 0 {
		return old // worthless: both rankings put it first
	}
	if op >= dTie*bp {
		return best
	}
	p.ref.add(best.key, old.key)
	if p.ref.trustDensity() {
		return best
	}
	return old
}

// calibrate sizes the policy to n blocks when they call for a new size
// (size.go: resized, grown). Every size-dependent parameter is in cache
// turnovers (a history of dHistory turnovers, decay per turnover, a
// warm-up of one turnover, one referee slot per block), so a wrong size
// costs most of the gain: told 8× the true size, density closed 2.5% of the
// development trace's LRU→Belady gap instead of 12.3% on average over five
// sizes, and told an eighth, it lost 0.0021 of hit ratio to LRU
// (docs/policy.md, "Capacity"). Shrinking trims the history at once: a
// pass over the entries above the new limit, once per calibration.
func (p *Density) calibrate(n int) {
	if p.noCalibrate || !resized(p.capacity, n) {
		return
	}
	p.capacity = n
	p.tr.limit = dHistory * n
	p.trim()
	p.period = uint64(n)
	p.nextConf = min(p.nextConf, p.clock+p.period)
	p.ref.init(n)
}

// Insert implements Policy.
func (p *Density) Insert(k Key, a AccessInfo) {
	if p.m[k] != nil {
		return
	}
	e := &dEntry{key: k, last: p.clock, mul: 1, hi: -1}
	if t := p.tr.m[k]; t != nil {
		e.cls = t.cls
		e.mul = t.mul
	}
	leafInsert(&p.leaves, p.m, k, e, a)
	if par := e.parent; par != nil {
		p.syncAge(par.self)
	}
	p.syncAge(e)
	if !p.sized {
		p.calibrate(grown(p.capacity, len(p.m)))
	}
}

// Remove implements Policy.
func (p *Density) Remove(k Key) {
	e := p.m[k]
	if e == nil {
		return
	}
	par := e.parent
	leafRemove(&p.leaves, p.m, k)
	p.syncAge(e)
	if par != nil && !par.gone {
		p.syncAge(par.self)
	}
}

// Victim implements Policy.
func (p *Density) Victim() (Key, bool) {
	p.sized = true
	p.calibrate(len(p.m))
	best := p.pick()
	if best == nil {
		for _, e := range p.m {
			if e.pins == 0 {
				if best == nil || p.density(e) < p.density(best) {
					best = e
				}
			}
		}
	}
	if best == nil {
		return Key{}, false
	}
	return best.key, true
}

// dHeap orders Density's leaves by last reference, least recent on top.
type dHeap []*dEntry

func (h dHeap) Len() int           { return len(h) }
func (h dHeap) Less(i, j int) bool { return h[i].last < h[j].last }
func (h dHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hi, h[j].hi = int32(i), int32(j)
}
func (h *dHeap) Push(x any) { e := x.(*dEntry); e.hi = int32(len(*h)); *h = append(*h, e) }
func (h *dHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	e.hi = -1
	return e
}

// Pin implements Policy.
func (p *Density) Pin(k Key) { leafPin(p.m, k) }

// Unpin implements Policy.
func (p *Density) Unpin(k Key) { leafUnpin(p.m, k) }

// Len implements Policy.
func (p *Density) Len() int { return len(p.m) }
