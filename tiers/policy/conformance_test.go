package policy

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvtier/kvtier/tiers/trace"
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
			t.Run("random-ops", func(t *testing.T) { randomOps(t, f, 32, 32, 20000) })
			// Built for the wrong size, in a tier whose size in blocks
			// changes: the policies that size themselves (size.go) resize
			// while blocks are pinned and removed under them.
			t.Run("random-ops-small-hint", func(t *testing.T) { randomOps(t, f, 4, 32, 20000) })
			t.Run("random-ops-large-hint", func(t *testing.T) { randomOps(t, f, 256, 32, 20000) })
		})
	}
}

// randomOps drives a policy built with capacity hint with random operations
// against a model of the resident set and the pins, and checks that Victim
// only names resident unpinned blocks and that Len matches. The tier holds
// capacity blocks, or a third of that in every other stretch of 2,000
// operations when hint differs from capacity.
func randomOps(t *testing.T, f Factory, hint, capacity, ops int) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 8))
	p := f(hint)
	full := capacity
	res := map[Key]bool{}
	pins := map[Key]int{}
	for op := range ops {
		if capacity = full; hint != full && (op/2000)%2 == 1 {
			capacity = full / 3
		}
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

// TestGhostResized checks that a resized ghost keeps the most recent keys
// that fit and stays bounded.
func TestGhostResized(t *testing.T) {
	g := newGhost(4)
	for i := range 10 {
		g.add(k(i))
	}
	g.take(k(8))
	for _, tt := range []struct {
		capacity int
		want     []int
	}{
		{2, []int{7, 9}},
		{8, []int{6, 7, 9}},
	} {
		h := g.resized(tt.capacity)
		if h.len() != len(tt.want) {
			t.Errorf("resized to %d: %d keys, want %v", tt.capacity, h.len(), tt.want)
		}
		for _, i := range tt.want {
			if !h.has(k(i)) {
				t.Errorf("resized to %d: lost key %d", tt.capacity, i)
			}
		}
		for i := 100; i < 120; i++ {
			h.add(k(i))
		}
		if h.len() != tt.capacity || !h.has(k(119)) {
			t.Errorf("resized to %d, then 20 adds: %d keys, newest kept %v", tt.capacity, h.len(), h.has(k(119)))
		}
	}
}

// TestSizeToTier checks that the size-dependent classic policies size
// themselves to the tier (size.go): built with a capacity 8 times too small
// or too large, each gets within 0.005 of the hit ratio it gets when told
// the true size.
func TestSizeToTier(t *testing.T) {
	cases := []genCase{
		{"docs", trace.Docs(1, 4000), 0.1},
		{"mixed", trace.Mixed(1, 4000), 0.05},
		{"chat", trace.Chat(1, 4000), 0.1},
	}
	for _, name := range []string{"arc", "s3fifo", "lru2"} {
		for _, tc := range cases {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				w, n := tc.sized()
				hit := func(hint int) float64 {
					p, err := New(name, hint)
					if err != nil {
						t.Fatal(err)
					}
					return w.Simulate(n, p).HitRatio()
				}
				exact := hit(n)
				for _, hint := range []int{n / 8, 8 * n} {
					if got := hit(hint); math.Abs(got-exact) > 0.005 {
						t.Errorf("N=%d hint %d: hit ratio %.4f, with the true size %.4f", n, hint, got, exact)
					}
				}
			})
		}
	}
}
