package policy

// ARC is the Adaptive Replacement Cache (Megiddo & Modha, FAST'03): T1 holds
// blocks seen once recently, T2 blocks seen at least twice; ghost lists B1/B2
// remember keys evicted from each, and a hit in a ghost list shifts the
// target size p of T1 toward the list that would have kept it. All
// operations are O(1).
//
// Mapping to the Policy protocol: Insert performs ARC's miss handling (ghost
// adaptation, ghost trimming, placement); Victim performs REPLACE; a Remove
// of the key Victim just returned is an eviction and leaves a ghost, any
// other Remove forgets the block outright.
type ARC struct {
	c              int
	p              int // target size of T1
	m              map[Key]*entry
	t1, t2, b1, b2 list
	lastInB2       bool // the last inserted block came from B2
	victim         Key
	victimOK       bool
	sized          bool // a Victim has been asked for: the tier was full (size.go)
}

const (
	segT1 uint8 = iota + 1
	segT2
	segB1
	segB2
)

// NewARC returns an ARC policy for capacity blocks.
func NewARC(capacity int) *ARC {
	a := &ARC{c: max(capacity, 1), m: make(map[Key]*entry)}
	a.t1.init()
	a.t2.init()
	a.b1.init()
	a.b2.init()
	return a
}

// Name implements Policy.
func (a *ARC) Name() string { return "arc" }

func (a *ARC) listOf(seg uint8) *list {
	switch seg {
	case segT1:
		return &a.t1
	case segT2:
		return &a.t2
	case segB1:
		return &a.b1
	default:
		return &a.b2
	}
}

func (a *ARC) move(e *entry, seg uint8) {
	a.listOf(e.seg).remove(e)
	e.seg = seg
	a.listOf(seg).pushFront(e)
}

func (a *ARC) resident(e *entry) bool { return e != nil && (e.seg == segT1 || e.seg == segT2) }

// Access implements Policy: a hit moves the block to T2's MRU end.
func (a *ARC) Access(k Key, _ AccessInfo) {
	if e := a.m[k]; a.resident(e) {
		a.move(e, segT2)
	}
}

// Admit implements Policy: ARC admits every block.
func (a *ARC) Admit(Key, AccessInfo) bool { return true }

func (a *ARC) dropLRU(l *list) {
	if e := l.back(); e != nil {
		l.remove(e)
		delete(a.m, e.key)
	}
}

// Insert implements Policy.
func (a *ARC) Insert(k Key, info AccessInfo) {
	e := a.m[k]
	if a.resident(e) {
		a.Access(k, info)
		return
	}
	a.lastInB2 = false
	switch {
	case e != nil && e.seg == segB1:
		d := 1
		if a.b1.n < a.b2.n {
			d = a.b2.n / a.b1.n
		}
		a.p = min(a.p+d, a.c)
		a.move(e, segT2)
		return
	case e != nil && e.seg == segB2:
		d := 1
		if a.b2.n < a.b1.n {
			d = a.b1.n / a.b2.n
		}
		a.p = max(a.p-d, 0)
		a.lastInB2 = true
		a.move(e, segT2)
		return
	}
	// Brand-new block: keep |T1|+|B1| ≤ c and the directory ≤ 2c.
	if a.t1.n+a.b1.n >= a.c && a.b1.n > 0 {
		a.dropLRU(&a.b1)
	} else if a.t1.n+a.t2.n+a.b1.n+a.b2.n >= 2*a.c && a.b2.n > 0 {
		a.dropLRU(&a.b2)
	}
	e = &entry{key: k, seg: segT1}
	a.m[k] = e
	a.t1.pushFront(e)
	if !a.sized {
		a.size(grown(a.c, a.Len()))
	}
}

// size sets c to the n blocks the tier holds (size.go) and trims the ghost
// lists to the directory bounds of the new c.
func (a *ARC) size(n int) {
	if !resized(a.c, n) {
		return
	}
	a.c = n
	a.p = min(a.p, a.c)
	for a.t1.n+a.b1.n > a.c && a.b1.n > 0 {
		a.dropLRU(&a.b1)
	}
	for a.t1.n+a.t2.n+a.b1.n+a.b2.n > 2*a.c && a.b2.n > 0 {
		a.dropLRU(&a.b2)
	}
}

// Remove implements Policy.
func (a *ARC) Remove(k Key) {
	e := a.m[k]
	if !a.resident(e) {
		return
	}
	if a.victimOK && a.victim == k {
		a.victimOK = false
		e.pins = 0
		if e.seg == segT1 {
			a.move(e, segB1)
		} else {
			a.move(e, segB2)
		}
		return
	}
	a.listOf(e.seg).remove(e)
	delete(a.m, k)
}

// Victim implements Policy (ARC's REPLACE).
func (a *ARC) Victim() (Key, bool) {
	a.sized = true
	a.size(a.Len())
	first, second := &a.t2, &a.t1
	if a.t1.n > 0 && (a.t1.n > a.p || (a.lastInB2 && a.t1.n == a.p)) {
		first, second = &a.t1, &a.t2
	}
	e := first.coldestUnpinned()
	if e == nil {
		e = second.coldestUnpinned()
	}
	if e == nil {
		return Key{}, false
	}
	a.victim, a.victimOK = e.key, true
	return e.key, true
}

// Pin implements Policy.
func (a *ARC) Pin(k Key) {
	if e := a.m[k]; a.resident(e) {
		e.pins++
	}
}

// Unpin implements Policy.
func (a *ARC) Unpin(k Key) {
	if e := a.m[k]; a.resident(e) && e.pins > 0 {
		e.pins--
	}
}

// Len implements Policy.
func (a *ARC) Len() int { return a.t1.n + a.t2.n }
