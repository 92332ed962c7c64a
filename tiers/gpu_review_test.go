//go:build !cuda

package tiers

import (
	"context"
	"testing"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// newGPURigSlabs is newGPURigN(t, 1, false) with its own slab sizes for the
// host tier and the GPU arena.
func newGPURigSlabs(t *testing.T, hostSlab, gpuSlab int64) *gpuRig {
	t.Helper()
	return newGPURigStore(t, hostSlab, gpuSlab, nil)
}

// newGPURigStore is newGPURigSlabs over a chain with NVMe store (nil: none).
func newGPURigStore(t *testing.T, hostSlab, gpuSlab int64, store *nvme.Store) *gpuRig {
	t.Helper()
	return newGPURigOpts(t, gpuRigOpts{hostSlab: hostSlab, gpuSlab: gpuSlab, store: store})
}

// A block larger than the GPU arena's slab can never be on the GPU: a
// device put or read of one must go to the host tier at once, without
// asking the demoter to empty the arena down to its low watermark (it would
// move other blocks off the GPU for nothing) and without counting a
// promotion fallback (which tells the operator the arena is too small).
func TestGPUBlockLargerThanGPUSlab(t *testing.T) {
	const big = 2 << 20 // the host slab; the GPU slab is 1 MiB
	r := newGPURigSlabs(t, big, 1<<20)
	g := r.gs.GPUs[0]
	k := chainKey(9, 1)
	hd, err := r.gs.Reserve(k, big, 0)
	if err != nil {
		t.Fatalf("reserve a %d-byte block for a device writer: %v", big, err)
	}
	if hd.Owner() != r.h {
		t.Fatal("a block larger than the GPU slab was reserved on the GPU")
	}
	if g.pressure.Load() || len(g.kick) > 0 {
		t.Fatal("reserving a block no GPU slab can hold asked the demoter to make room on the GPU")
	}
	copy(r.h.Bytes(hd), blockFor(k, big))
	if err := r.h.Commit(hd); err != nil {
		t.Fatal(err)
	}
	hd, ok := r.gs.Acquire(k, big, 0, true, func(*Handle, error) {})
	if !ok || hd == nil {
		t.Fatalf("device read of a host block no GPU slab can hold: lease %v, ok %v; want the host copy at once, not a promotion", hd != nil, ok)
	}
	if hd.Owner() != r.h {
		t.Fatal("device read of an oversized block not served from the host tier")
	}
	r.h.Release(hd)
	if g.pressure.Load() || len(g.kick) > 0 {
		t.Fatal("a device read of a block no GPU slab can hold asked the demoter to make room on the GPU")
	}
	if st := r.gs.Stats(); st.PromotionFallbacks[0] != 0 {
		t.Fatalf("promotion fallbacks %d, want 0: the block can never be promoted", st.PromotionFallbacks[0])
	}
}

// A lookup whose chain has a GPU-resident block between host blocks is one
// request to the replacement policy: the host blocks after the GPU block
// keep their place in the chain and their parent (the policy ranks the
// leaves of the prefix tree), and the whole lookup has one request number.
func TestGPULookupReportsWholeChainToPolicy(t *testing.T) {
	store, err := nvme.Open(context.Background(), nvme.Options{Dir: t.TempDir() + "/nvme", CapacityBytes: nvme.MinCapacity, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	r := newGPURigStore(t, 1<<20, 1<<20, store)
	keys := []Key{chainKey(3, 1), chainKey(3, 2), chainKey(3, 3)}
	for i, k := range keys {
		gpu := -1
		if i == 1 {
			gpu = 0 // the middle block on the GPU, the others on the host
		}
		if at := r.put(t, k, gpu); (at == r.h) != (i != 1) {
			t.Fatalf("block %d landed in the wrong tier", i)
		}
	}
	for len(r.c.polCh) > 0 {
		<-r.c.polCh // the puts' inserts
	}
	out := make([]shm.Tier, len(keys))
	hits, req := r.gs.Lookup(keys, out)
	if hits != 3 || out[0] != shm.TierHost || out[1] != shm.TierGPU || out[2] != shm.TierHost {
		t.Fatalf("lookup: %d hits, tiers %v", hits, out)
	}
	type seen struct {
		pos       int32
		parent    Key
		chainLen  int
		request   uint64
		hasParent bool
	}
	got := map[Key]seen{}
	for len(r.c.polCh) > 0 {
		ev := <-r.c.polCh
		if ev.op != polLookup {
			continue
		}
		for i, k := range ev.chain {
			got[fromPK(k)] = seen{pos: ev.pos[i], parent: fromPK(ev.parent[i]), chainLen: ev.a.ChainLen, request: ev.a.Request, hasParent: ev.pos[i] > 0}
		}
	}
	want := map[Key]seen{
		keys[0]: {pos: 0, chainLen: 3, request: req},
		keys[2]: {pos: 2, parent: keys[1], chainLen: 3, request: req, hasParent: true},
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("policy saw %v as %+v (reported %v), want %+v", k, g, ok, w)
		}
	}
}

// A lookup announces reads: GPU-resident blocks it finds become the most
// recently used of their arena, head of the chain last (as in the host
// tier), so that the demoter moves blocks nobody asked for first.
func TestGPULookupRefreshesRecency(t *testing.T) {
	r := newGPURigN(t, 1, false)
	g := r.gs.GPUs[0]
	a, b, c := chainKey(4, 1), chainKey(4, 2), chainKey(4, 3)
	for _, k := range []Key{a, b, c} { // a is the oldest
		if at := r.put(t, k, 0); at != g.Slots {
			t.Fatal("a device put with room did not land on the GPU")
		}
	}
	out := make([]shm.Tier, 2)
	if hits, _ := r.gs.Lookup([]Key{a, b}, out); hits != 2 {
		t.Fatalf("lookup: %d hits", hits)
	}
	var order []Key
	for _, hd := range g.Slots.PinColdest(3, nil) {
		order = append(order, hd.Key)
		g.Slots.Unpin(hd, false)
	}
	if want := []Key{c, b, a}; len(order) != 3 || order[0] != want[0] || order[1] != want[1] || order[2] != want[2] {
		t.Fatalf("coldest first after a lookup of [a b]: %v, want [c b a] = %v", order, want)
	}
}
