package tiers

import (
	"maps"
	"slices"
	"testing"
)

// TestHostNamespaces: Host.Namespaces names the namespace of every block
// the tier holds (committed, reserved, disowned, deleted but still leased),
// which a full namespace registry relies on before reclaiming one, and none
// once they are gone.
func TestHostNamespaces(t *testing.T) {
	h, arena := newHost(t, 1<<16, 4)
	got := func() []uint32 {
		seen := map[uint32]bool{}
		h.Namespaces(func(ns uint32) { seen[ns] = true })
		return slices.Sorted(maps.Keys(seen))
	}
	put(t, h, arena, key(1, 1), 4096) // committed
	reserved, err := h.Reserve(key(2, 1), 4096)
	if err != nil {
		t.Fatal(err)
	}
	put(t, h, arena, key(3, 1), 4096)
	leased, ok := h.Acquire(key(3, 1))
	if !ok || !h.Delete(key(3, 1)) { // deleted, still leased
		t.Fatal("acquire and delete of ns 3's block failed")
	}
	disowned, err := h.Reserve(key(4, 1), 4096)
	if err != nil || !h.Disown(disowned) {
		t.Fatalf("reserve and disown of ns 4's block: %v", err)
	}
	put(t, h, arena, key(5|ParkedNS, 1), 4096) // parked: reported as is
	if g, want := got(), []uint32{1, 2, 3, 4, 5 | ParkedNS}; !slices.Equal(g, want) {
		t.Fatalf("Namespaces = %v, want %v", g, want)
	}
	for _, err := range []error{h.Abort(reserved), h.Release(leased), h.Abort(disowned)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	h.DeleteNS(5 | ParkedNS)
	if g, want := got(), []uint32{1}; !slices.Equal(g, want) {
		t.Fatalf("after abort, release and delete: Namespaces = %v, want %v", g, want)
	}
}
