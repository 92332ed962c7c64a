package policy

// ghost is a bounded FIFO set of keys of recently evicted blocks (no data),
// used by ARC, S3-FIFO and Chain to recognize blocks that come back. It is a
// ring of keys plus a map from key to its ring generation; O(1) per op.
type ghost struct {
	ring []Key
	gen  []uint64
	m    map[Key]uint64 // key → generation when added
	head int            // next slot to overwrite
	seq  uint64
	n    int
}

func newGhost(capacity int) *ghost {
	capacity = max(capacity, 1)
	return &ghost{ring: make([]Key, capacity), gen: make([]uint64, capacity), m: make(map[Key]uint64, capacity)}
}

func (g *ghost) add(k Key) {
	if g.ring[g.head] != (Key{}) || g.gen[g.head] != 0 {
		old := g.ring[g.head]
		if gg, ok := g.m[old]; ok && gg == g.gen[g.head] {
			delete(g.m, old)
			g.n--
		}
	}
	g.seq++
	if _, ok := g.m[k]; !ok {
		g.n++
	}
	g.ring[g.head], g.gen[g.head] = k, g.seq
	g.m[k] = g.seq
	g.head = (g.head + 1) % len(g.ring)
}

func (g *ghost) has(k Key) bool { _, ok := g.m[k]; return ok }

// take removes k if present and reports whether it was.
func (g *ghost) take(k Key) bool {
	if _, ok := g.m[k]; ok {
		delete(g.m, k)
		g.n--
		return true
	}
	return false
}

func (g *ghost) len() int { return g.n }

// resized returns a ghost of capacity keys holding g's most recent ones.
func (g *ghost) resized(capacity int) *ghost {
	out := newGhost(capacity)
	for i := range g.ring {
		j := (g.head + i) % len(g.ring) // oldest first
		if k := g.ring[j]; g.gen[j] != 0 && g.m[k] == g.gen[j] {
			out.add(k)
		}
	}
	return out
}
