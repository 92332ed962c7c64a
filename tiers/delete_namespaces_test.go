package tiers

import (
	"testing"
	"time"
)

// TestDeleteNamespacesMatchesDeleteNS: DeleteNamespaces (an evict of
// everything) removes the blocks a DeleteNS of each of its namespaces
// would, counts them the same (a block in both tiers once, a leased host
// block too), clears the parked set of those namespaces and leaves the
// others alone; and it walks the NVMe index once, where the DeleteNSes
// walk it once each.
func TestDeleteNamespacesMatchesDeleteNS(t *testing.T) {
	const bs = 64 << 10
	const a, b, other = 1, 2, 3
	set := []uint32{a, b, a | ParkedNS, b | ParkedNS}
	var keys []Key
	fill := func(t *testing.T) (*chainRig, *Handle) {
		r := newChainRig(t, rigOpts{hostBytes: 16 << 20, slabBytes: 1 << 20, noStart: true,
			cfg: ChainConfig{Policy: "lru", ParkTTL: time.Hour}})
		keys = keys[:0]
		i := uint64(0)
		next := func(ns uint32) Key {
			i++
			k := chainKey(ns, i)
			keys = append(keys, k)
			return k
		}
		for _, ns := range []uint32{a, b, other} {
			r.putHost(t, next(ns), bs)
			r.putNVMe(t, next(ns), bs)
			k := next(ns)
			r.putHost(t, k, bs)
			r.putNVMe(t, k, bs)
			r.putHost(t, next(ns|ParkedNS), bs) // parked, still in the host tier (not started)
			k = next(ns | ParkedNS)             // parked, written through
			r.putNVMe(t, k, bs)
			r.c.parkMu.Lock()
			r.c.parked[k] = time.Now().Add(time.Hour)
			r.c.parkMu.Unlock()
		}
		k := next(a)
		r.putHost(t, k, bs)
		hd, ok := r.h.Acquire(k) // a session's lease
		if !ok {
			t.Fatalf("acquire %v", k)
		}
		return r, hd
	}
	type outcome struct {
		n             int
		walks         uint64
		stored        map[Key]bool
		parked        map[Key]bool
		hostAfterFree int
	}
	run := func(t *testing.T, del func(c *Chain) int) outcome {
		r, lease := fill(t)
		walks := r.store.Stats().IndexWalks
		o := outcome{n: del(r.c), stored: map[Key]bool{}, parked: map[Key]bool{}}
		o.walks = r.store.Stats().IndexWalks - walks
		for _, k := range keys {
			o.stored[k], o.parked[k] = r.inAny(k), r.c.isParked(k)
		}
		if err := r.h.Release(lease); err != nil {
			t.Fatal(err)
		}
		o.hostAfterFree = r.h.Stats().Blocks
		return o
	}
	each := run(t, func(c *Chain) int {
		n := 0
		for _, ns := range set {
			n += c.DeleteNS(ns)
		}
		return n
	})
	once := run(t, func(c *Chain) int {
		nss := map[uint32]struct{}{}
		for _, ns := range set {
			nss[ns] = struct{}{}
		}
		return c.DeleteNamespaces(nss)
	})
	// 5 blocks in each of a and b (one in both tiers), and a's leased one.
	if each.n != 11 || once.n != each.n {
		t.Errorf("DeleteNamespaces counted %d blocks, a DeleteNS of each namespace %d; want 11", once.n, each.n)
	}
	if each.walks != uint64(len(set)) || once.walks != 1 {
		t.Errorf("NVMe index walked %d times by DeleteNamespaces, %d by a DeleteNS of each of %d namespaces; want 1 and %d",
			once.walks, each.walks, len(set), len(set))
	}
	for _, k := range keys {
		gone := k.NS&^ParkedNS != other
		if once.stored[k] != each.stored[k] || once.stored[k] == gone {
			t.Errorf("%v: stored %v after DeleteNamespaces, %v after DeleteNS of each; want %v", k, once.stored[k], each.stored[k], !gone)
		}
		if want := k.Parked() && !gone; once.parked[k] != want || each.parked[k] != want {
			t.Errorf("%v: parked %v after DeleteNamespaces, %v after DeleteNS of each; want %v", k, once.parked[k], each.parked[k], want)
		}
	}
	if once.hostAfterFree != each.hostAfterFree || once.hostAfterFree != 3 {
		t.Errorf("host tier holds %d blocks after DeleteNamespaces, %d after DeleteNS of each; want 3 (namespace %d's)",
			once.hostAfterFree, each.hostAfterFree, other)
	}
}
