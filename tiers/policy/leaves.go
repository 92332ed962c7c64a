package policy

// leafNode is the prefix-tree bookkeeping shared by the policies that evict
// only chain tails (Hyper, Density, LRB): a block is worth keeping only while its
// parent is, so victims are drawn from the leaves (blocks with no resident
// child). E is the policy's entry type; its entries embed a leafNode that
// points back at them through self.
type leafNode[E any] struct {
	self     E
	parent   *leafNode[E]
	children int32
	li       int32 // index in the leaf set; -1 when not a leaf
	pins     int32 // leases (Pin/Unpin); a pinned block is never a victim
	orphan   bool  // inserted without a resident parent
	gone     bool  // removed; children may still point at it
}

func (n *leafNode[E]) node() *leafNode[E] { return n }

// leafEntry is a leaf policy's entry: a pointer to a struct embedding
// leafNode.
type leafEntry[E any] interface {
	comparable
	node() *leafNode[E]
}

// leafInsert stores e under k and makes it a leaf below the resident parent
// of a (an orphan when a has a parent that is not resident).
func leafInsert[E leafEntry[E]](s *leafSet[E], m map[Key]E, k Key, e E, a AccessInfo) {
	m[k] = e
	var par *leafNode[E]
	orphan := false
	if a.HasParent {
		if pe, ok := m[a.Parent]; ok {
			par = pe.node()
		} else {
			orphan = true
		}
	}
	s.insert(e, e.node(), par, orphan)
}

// leafRemove forgets k (unknown keys are ignored).
func leafRemove[E leafEntry[E]](s *leafSet[E], m map[Key]E, k Key) {
	e, ok := m[k]
	if !ok {
		return
	}
	delete(m, k)
	s.remove(e.node())
}

// leafPin and leafUnpin implement Policy.Pin and Unpin over m.
func leafPin[E leafEntry[E]](m map[Key]E, k Key) {
	if e, ok := m[k]; ok {
		e.node().pins++
	}
}

func leafUnpin[E leafEntry[E]](m map[Key]E, k Key) {
	if e, ok := m[k]; ok && e.node().pins > 0 {
		e.node().pins--
	}
}

// worthless reports a block whose prefix is broken: Lookup can never reach
// it, so it is the first to go.
func (n *leafNode[E]) worthless() bool {
	return n.orphan || (n.parent != nil && n.parent.gone)
}

// leafSet is the set of leaves, in a slice for O(1) uniform sampling.
type leafSet[E any] struct {
	l []*leafNode[E]
}

func (s *leafSet[E]) add(n *leafNode[E]) {
	n.li = int32(len(s.l))
	s.l = append(s.l, n)
}

func (s *leafSet[E]) del(n *leafNode[E]) {
	if n.li < 0 {
		return
	}
	last := s.l[len(s.l)-1]
	s.l[n.li] = last
	last.li = n.li
	s.l = s.l[:len(s.l)-1]
	n.li = -1
}

// insert makes n a leaf below par (nil for a chain head; orphan for a block
// whose parent is not resident).
func (s *leafSet[E]) insert(self E, n *leafNode[E], par *leafNode[E], orphan bool) {
	n.self, n.li, n.orphan = self, -1, orphan
	if par != nil {
		n.parent = par
		par.children++
		s.del(par)
	}
	s.add(n)
}

// remove takes n out of the tree; a parent left without children becomes
// a leaf again.
func (s *leafSet[E]) remove(n *leafNode[E]) {
	n.gone = true
	s.del(n)
	if par := n.parent; par != nil && !par.gone {
		par.children--
		if par.children == 0 {
			s.add(par)
		}
	}
	n.parent = nil
}

// sample returns the i-th candidate of a draw of min(max, len) leaves:
// all of them when they are few, uniform picks otherwise.
func (s *leafSet[E]) sample(i, max int, rng interface{ IntN(int) int }) E {
	if len(s.l) > max {
		return s.l[rng.IntN(len(s.l))].self
	}
	return s.l[i].self
}

func (s *leafSet[E]) len() int { return len(s.l) }
