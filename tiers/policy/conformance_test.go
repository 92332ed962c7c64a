package policy

import (
	"math/rand/v2"
	"testing"
)

// online lists every online policy under test.
func online() map[string]Factory {
	out := map[string]Factory{}
	for _, n := range Names() {
		out[n] = factories[n]
	}
	return out
}

func k(i int) Key { return KeyOf(int64(i)) }

func chainInfo(pos int, req uint64) AccessInfo {
	a := AccessInfo{Pos: pos, ChainLen: 64, Request: req}
	if pos > 0 {
		a.HasParent, a.Parent = true, k(pos-1+int(req)*1000)
	}
	return a
}

func TestNewUnknown(t *testing.T) {
	if _, err := New("nope", 10); err == nil {
		t.Fatal("New accepted an unknown name")
	}
	if _, err := New(Default, 0); err == nil {
		t.Fatal("New accepted capacity 0")
	}
	for _, n := range Names() {
		p, err := New(n, 10)
		if err != nil || p.Name() != n {
			t.Fatalf("New(%q) = %v, %v", n, p, err)
		}
	}
}

func TestConformance(t *testing.T) {
	for name, f := range online() {
		t.Run(name, func(t *testing.T) {
			t.Run("empty", func(t *testing.T) {
				p := f(4)
				if _, ok := p.Victim(); ok {
					t.Fatal("Victim on empty policy returned ok")
				}
				p.Remove(k(1)) // unknown: harmless
				p.Pin(k(1))
				p.Unpin(k(1))
				p.Access(k(1), AccessInfo{})
				if p.Len() != 0 {
					t.Fatalf("Len = %d, want 0", p.Len())
				}
			})
			t.Run("len-and-remove", func(t *testing.T) {
				p := f(8)
				for i := range 5 {
					p.Insert(k(i), chainInfo(i, 0))
				}
				p.Insert(k(2), chainInfo(2, 0)) // duplicate insert must not count twice
				if p.Len() != 5 {
					t.Fatalf("Len = %d, want 5", p.Len())
				}
				p.Remove(k(99))
				p.Remove(k(4))
				p.Remove(k(4))
				if p.Len() != 4 {
					t.Fatalf("Len = %d, want 4", p.Len())
				}
				seen := map[Key]bool{}
				for p.Len() > 0 {
					v, ok := p.Victim()
					if !ok || seen[v] || v == k(4) {
						t.Fatalf("Victim = %v, %v (seen %v)", v, ok, seen)
					}
					seen[v] = true
					p.Remove(v)
				}
			})
			t.Run("pinned-never-victim", func(t *testing.T) {
				p := f(4)
				for i := range 4 {
					p.Insert(k(i), chainInfo(i, 0))
				}
				for i := range 4 {
					p.Pin(k(i))
				}
				p.Pin(k(0)) // nested
				if v, ok := p.Victim(); ok {
					t.Fatalf("all pinned, Victim = %v", v)
				}
				p.Unpin(k(0))
				if v, ok := p.Victim(); ok {
					t.Fatalf("k0 still pinned once, Victim = %v", v)
				}
				p.Unpin(k(0))
				v, ok := p.Victim()
				if !ok || v != k(0) {
					t.Fatalf("only k0 unpinned, Victim = %v, %v", v, ok)
				}
			})
			t.Run("random-ops", func(t *testing.T) { randomOps(t, f, 32, 20000) })
		})
	}
}

// randomOps drives a policy with random operations against a model of the
// resident set and the pins, at a fixed capacity, and checks that Victim
// only names resident unpinned blocks and that Len matches.
func randomOps(t *testing.T, f Factory, capacity, ops int) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 8))
	p := f(capacity)
	res := map[Key]bool{}
	pins := map[Key]int{}
	for op := range ops {
		req := uint64(op / 8)
		id := r.IntN(4 * capacity)
		key, a := k(id), AccessInfo{Pos: id % 8, ChainLen: 8, Request: req, TimeMs: int64(op)}
		if a.Pos > 0 {
			a.HasParent, a.Parent = true, k(id-1)
		}
		switch x := r.IntN(20); {
		case x < 10:
			if res[key] {
				p.Access(key, a)
			} else if p.Admit(key, a) {
				p.Insert(key, a)
				res[key] = true
			}
		case x < 12:
			p.Remove(key)
			delete(res, key)
			delete(pins, key)
		case x < 14:
			if res[key] {
				p.Pin(key)
				pins[key]++
			}
		case x < 16:
			if pins[key] > 0 {
				p.Unpin(key)
				if pins[key]--; pins[key] == 0 {
					delete(pins, key)
				}
			}
		default:
			p.Unpin(k(-1 - id)) // unknown
		}
		for len(res) > capacity {
			v, ok := p.Victim()
			if !ok {
				if len(pins) < len(res) {
					t.Fatalf("op %d: no victim with %d resident, %d pinned", op, len(res), len(pins))
				}
				break
			}
			if !res[v] {
				t.Fatalf("op %d: victim %v not resident", op, v)
			}
			if pins[v] > 0 {
				t.Fatalf("op %d: victim %v is pinned", op, v)
			}
			p.Remove(v)
			delete(res, v)
		}
		if p.Len() != len(res) {
			t.Fatalf("op %d: Len = %d, model %d", op, p.Len(), len(res))
		}
	}
}

func TestGhostBounded(t *testing.T) {
	g := newGhost(4)
	for i := range 100 {
		g.add(k(i % 7))
		if g.len() > 4 {
			t.Fatalf("ghost holds %d > 4", g.len())
		}
	}
	if !g.has(k(99%7)) || !g.take(k(99%7)) || g.has(k(99%7)) {
		t.Fatal("ghost lost its newest key or take failed")
	}
}
