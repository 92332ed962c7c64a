package tiers

import (
	"testing"
	"time"
)

// TestOversizeParkedBlockKept: a parked block larger than the NVMe tier's
// largest block cannot be written through. It stays in the host tier, and
// must not be dropped for space there when other blocks need the room: it
// is kept until resumed, released or its TTL, like any parked block.
func TestOversizeParkedBlockKept(t *testing.T) {
	r := newChainRig(t, rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20})
	size := r.store.MaxBlockBytes() + 4096
	if size > 1<<20 {
		r = newChainRig(t, rigOpts{hostBytes: 4 * (size + 4096), slabBytes: size + 4096})
	}
	parked := Key{NS: 3 | ParkedNS, Hash: chainKey(70, 1).Hash}
	r.putHost(t, parked, size)
	eventually(t, 5*time.Second, "the write-through to fail", func() bool { return r.c.Stats().ParkErrors > 0 })
	// Other blocks of the same size want the whole host tier.
	for i := range 4 {
		hd, err := r.c.Reserve(chainKey(71, uint64(i)), size)
		if err != nil {
			continue // full of the parked block: fine
		}
		if err := r.h.Commit(hd); err != nil {
			t.Fatal(err)
		}
	}
	if !r.h.Contains(parked) {
		t.Fatal("the parked block (too large for NVMe) was dropped from the host tier for space")
	}
	if !r.c.Delete(parked) || r.inAny(parked) {
		t.Fatal("delete of the parked block")
	}
}

// TestReparkedKeyFreesOldHandle: a parked block kept in the host tier
// (too large for NVMe) is released and its request parked again under the
// same id. The old block's slot, pinned for the write-through retry, must
// be freed: the key is parked again, but by a new block.
func TestReparkedKeyFreesOldHandle(t *testing.T) {
	o := rigOpts{hostBytes: 4 << 20, slabBytes: 1 << 20, cfg: ChainConfig{ParkTTL: 5 * time.Second}}
	r := newChainRig(t, o)
	size := r.store.MaxBlockBytes() + 4096
	if size > 1<<20 {
		o.hostBytes, o.slabBytes = 4*(size+4096), size+4096
		r = newChainRig(t, o)
	}
	k := Key{NS: 3 | ParkedNS, Hash: chainKey(72, 1).Hash}
	r.putHost(t, k, size)
	eventually(t, 5*time.Second, "the write-through to fail", func() bool { return r.c.Stats().ParkErrors == 1 })
	if !r.c.Delete(k) { // resumed
		t.Fatal("delete of the parked block")
	}
	r.putHost(t, k, size) // parked again
	eventually(t, 5*time.Second, "the second write-through to fail", func() bool { return r.c.Stats().ParkErrors == 2 })
	eventually(t, 2*time.Second, "the released block's slot to be freed", func() bool { return r.h.Stats().Leased == 1 })
	if !r.c.Delete(k) || r.inAny(k) {
		t.Fatal("delete of the parked block")
	}
}
