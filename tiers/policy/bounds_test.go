package policy

// Bounds on policy state over long runs, and orphans made by removals.

import "testing"

// lrbPending counts LRB's unlabelled samples (all age-bin FIFOs) and the
// pendRefs the history entry of key holds.
func lrbPending(p *LRB, key Key) (fifo, refs int) {
	for q := range p.pend {
		fifo += len(p.pend[q].s) - p.pend[q].head
	}
	if h := p.hist[key]; h != nil {
		refs = len(h.pend)
	}
	return
}

// TestAuditLRBPendingGrowth: one resident leaf that is never referenced
// again (a cold chain head) while a small hot set is hit over and over. The
// history never fills (9 distinct keys ≪ 16 × capacity), so the cold leaf
// stays sampled; each sample's deadline is twice its age, so the pending
// samples (and the cold entry's pend slice) grow linearly with the number
// of references, without bound.
func TestLRBPendingBounded(t *testing.T) {
	p := NewLRB(64)
	cold := k(1_000_000)
	p.Admit(cold, AccessInfo{ChainLen: 1, Request: 0})
	p.Insert(cold, AccessInfo{ChainLen: 1, Request: 0})
	for i := range 8 {
		a := AccessInfo{ChainLen: 1, Request: uint64(1 + i)}
		p.Admit(k(i), a)
		p.Insert(k(i), a)
	}
	req := uint64(100)
	run := func(n int) {
		for range n {
			req++
			p.Access(k(int(req%8)), AccessInfo{ChainLen: 1, Request: req})
		}
	}
	var fifos, refs []int
	for range 4 {
		run(50_000)
		f, r := lrbPending(p, cold)
		fifos, refs = append(fifos, f), append(refs, r)
	}
	t.Logf("after 50k,100k,150k,200k refs: pending samples %v, cold entry's pend %v, history %d, leaves %d", fifos, refs, len(p.hist), p.leaves.len())
	if fifos[3] > 2*fifos[0] || refs[3] > 2*refs[0]+64 {
		t.Fatalf("pending samples grow with the number of references: %v (cold entry %v)", fifos, refs)
	}
}

// TestAuditChainOrphanAfterParentRemove: Chain's type comment says "A block
// whose parent is removed by the tier (Delete, demotion) is an orphan and is
// evicted before any other leaf", and Density, Hyper and LRB do so
// (worthless checks parent.gone). Chain only sets orphan at Insert, so a
// block whose parent was deleted keeps its LRU place.
// TestOrphanAfterParentRemove: a block whose parent the tier removed
// serves no hit and is the next victim (chain used to keep its place).
func TestOrphanAfterParentRemove(t *testing.T) {
	for _, name := range []string{"chain", "density", "hyper"} {
		t.Run(name, func(t *testing.T) {
			p, _ := New(name, 8)
			a, b, x := k(1), k(2), k(3)
			for _, s := range []struct {
				k Key
				a AccessInfo
			}{
				{a, AccessInfo{ChainLen: 2, Request: 1}},
				{b, AccessInfo{Pos: 1, ChainLen: 2, Request: 1, HasParent: true, Parent: a}},
				{x, AccessInfo{ChainLen: 1, Request: 2}},
			} {
				if !p.Admit(s.k, s.a) {
					t.Fatalf("%v refused", s.k)
				}
				p.Insert(s.k, s.a)
			}
			p.Access(b, AccessInfo{Pos: 1, ChainLen: 2, Request: 3, HasParent: true, Parent: a}) // b more recent than x
			p.Remove(a)                                                                          // Delete of b's parent: b can serve no hit
			if v, ok := p.Victim(); !ok || v != b {
				t.Fatalf("Victim = %v, %v; want the block whose parent was removed (%v), not %v", v, ok, b, x)
			}
		})
	}
}

// stateSizes measures the per-key structures of the policies.
func stateSizes(p Policy) map[string]int {
	out := map[string]int{"len": p.Len()}
	switch q := p.(type) {
	case *Density:
		out["m"] = len(q.m)
		out["tr"] = len(q.tr.m)
		out["first"] = len(q.first)
		out["refpend"] = len(q.ref.pend)
		out["pairs"] = len(q.ref.pairs)
		out["byAge"] = q.byAge.Len()
		out["leaves"] = q.leaves.len()
	case *LRB:
		out["m"] = len(q.m)
		out["hist"] = len(q.hist)
		n := 0
		for i := range q.pend {
			n += len(q.pend[i].s)
		}
		out["pendcap"] = n
		out["trX"] = len(q.trX)
	case *LRU2:
		out["hist"] = len(q.hist)
		out["histQ"] = len(q.histQ)
		out["heap"] = q.h.Len()
	case *ARC:
		out["m"] = len(q.m)
		out["b1"], out["b2"] = q.b1.n, q.b2.n
	case *S3FIFO:
		out["m"] = len(q.m)
		out["ghost"] = len(q.g.m)
	case *Chain:
		out["m"] = len(q.m)
		out["heap"] = q.h.Len()
	case *Hyper:
		out["m"] = len(q.m)
		out["leaves"] = q.leaves.len()
	}
	return out
}

// TestPolicyStateBoundedDistinctKeys: endless distinct keys (chains of 4,
// capacity 64, evicting to capacity): no structure of any policy grows
// with the number of references (a daemon runs for weeks).
func TestPolicyStateBoundedDistinctKeys(t *testing.T) {
	for name, f := range online() {
		p := f(64)
		var sizes []map[string]int
		id := 0
		for _, n := range []int{10000, 40000} {
			for id < n {
				for pos := range 4 {
					key := k(id*4 + pos)
					a := AccessInfo{Pos: pos, ChainLen: 4, Request: uint64(id)}
					if pos > 0 {
						a.HasParent, a.Parent = true, k(id*4+pos-1)
					}
					if p.Admit(key, a) {
						p.Insert(key, a)
					}
					for p.Len() > 64 {
						v, _ := p.Victim()
						p.Remove(v)
					}
				}
				id++
			}
			sizes = append(sizes, stateSizes(p))
		}
		checkBounded(t, name, sizes)
	}
}

// TestPolicyStateBoundedChurn: Insert/Remove churn without Victim, around
// a few long-lived blocks (LRB's pending samples used to grow here).
func TestPolicyStateBoundedChurn(t *testing.T) {
	for name, f := range online() {
		p := f(64)
		var sizes []map[string]int
		for i := range 8 {
			a := AccessInfo{ChainLen: 1, Request: uint64(i)}
			p.Admit(k(-1-i), a)
			p.Insert(k(-1-i), a)
		}
		id := 0
		for _, n := range []int{10000, 40000} {
			for id < n {
				key := k(id)
				a := AccessInfo{ChainLen: 1, Request: uint64(1000 + id)}
				if p.Admit(key, a) {
					p.Insert(key, a)
				}
				p.Access(k(-1-id%4), AccessInfo{ChainLen: 1, Request: uint64(1000 + id)})
				p.Remove(key)
				id++
			}
			sizes = append(sizes, stateSizes(p))
		}
		checkBounded(t, name, sizes)
	}
}

// checkBounded fails if a structure grew between the measurement after
// 10,000 and after 40,000 requests by more than half again plus 64.
func checkBounded(t *testing.T, name string, sizes []map[string]int) {
	t.Helper()
	first, last := sizes[0], sizes[len(sizes)-1]
	for s, n := range last {
		if n > first[s]+first[s]/2+64 {
			t.Errorf("%s: %s grew from %d to %d between 10k and 40k requests", name, s, first[s], n)
		}
	}
	t.Logf("%s: %v", name, last)
}
