package policy

// LRU evicts the least recently used block. It admits everything.
// Every operation is O(1).
type LRU struct {
	m map[Key]*entry
	l list
}

// NewLRU returns an empty LRU policy.
func NewLRU() *LRU { l := &LRU{m: make(map[Key]*entry)}; l.l.init(); return l }

// Name implements Policy.
func (p *LRU) Name() string { return "lru" }

// Access implements Policy.
func (p *LRU) Access(k Key, _ AccessInfo) {
	if e := p.m[k]; e != nil {
		p.l.moveToFront(e)
	}
}

// Admit implements Policy: LRU admits every block.
func (p *LRU) Admit(Key, AccessInfo) bool { return true }

// Insert implements Policy.
func (p *LRU) Insert(k Key, a AccessInfo) {
	if e := p.m[k]; e != nil {
		p.Access(k, a)
		return
	}
	e := &entry{key: k}
	p.m[k] = e
	p.l.pushFront(e)
}

// Remove implements Policy.
func (p *LRU) Remove(k Key) {
	if e := p.m[k]; e != nil {
		p.l.remove(e)
		delete(p.m, k)
	}
}

// Victim implements Policy.
func (p *LRU) Victim() (Key, bool) {
	if e := p.l.coldestUnpinned(); e != nil {
		return e.key, true
	}
	return Key{}, false
}

// Pin implements Policy.
func (p *LRU) Pin(k Key) {
	if e := p.m[k]; e != nil {
		e.pins++
	}
}

// Unpin implements Policy.
func (p *LRU) Unpin(k Key) {
	if e := p.m[k]; e != nil && e.pins > 0 {
		e.pins--
	}
}

// Len implements Policy.
func (p *LRU) Len() int { return len(p.m) }
