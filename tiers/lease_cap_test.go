package tiers

import "testing"

// TestAcquireStopsAtMaxLeases: a block's lease count is an int32; leases
// from many sessions on one block must not wrap it, which would make the
// block look unleased (and freeable) while readers still hold it.
func TestAcquireStopsAtMaxLeases(t *testing.T) {
	h, err := NewHost(make([]byte, 1<<20), HostConfig{SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	k := Key{NS: 1}
	hd, err := h.Reserve(k, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Commit(hd); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.Acquire(k); !ok {
		t.Fatal("first Acquire missed")
	}
	h.mu.Lock()
	hd.leases = maxLeases - 1 // as if held by that many readers
	h.mu.Unlock()
	if _, ok := h.Acquire(k); !ok {
		t.Fatal("Acquire below the cap missed")
	}
	if _, ok := h.Acquire(k); ok {
		h.mu.Lock()
		n := hd.leases
		h.mu.Unlock()
		t.Fatalf("Acquire at %d leases succeeded (count now %d): the int32 count can wrap", maxLeases, n)
	}
	// The tier's own pins still fit above the cap.
	if _, ok := h.Pin(k); !ok {
		t.Fatal("a movement pin of a block at the lease cap failed")
	}
	h.mu.Lock()
	n := hd.leases
	h.mu.Unlock()
	if n != maxLeases+1 {
		t.Fatalf("lease count %d, want %d", n, maxLeases+1)
	}
}
