//go:build !cuda

package tiers

import (
	"context"
	"errors"
	"testing"

	"github.com/kvtier/kvtier/tiers/nvme"
)

// TestGPUFlush: GPUSet.Flush (the shutdown write-down of the GPU tier)
// copies the GPU-only blocks into the host tier, byte-exact, leased ones
// too (which keep their lease and their GPU copy); it skips blocks with a
// copy below already (host, or NVMe), writes nothing once its context has
// ended (and says so), and does nothing without an NVMe tier.
func TestGPUFlush(t *testing.T) {
	ctx := context.Background()
	t.Run("no nvme", func(t *testing.T) {
		r := newGPURigSlabs(t, 1<<20, 1<<20)
		k := chainKey(4, 1)
		r.put(t, k, 0)
		if n, err := r.gs.Flush(ctx); n != 0 || err != nil || r.h.Contains(k) {
			t.Fatalf("Flush without NVMe = %d, %v (host holds it: %v); want 0, nil, no copy", n, err, r.h.Contains(k))
		}
	})
	store, err := nvme.Open(ctx, nvme.Options{Dir: t.TempDir() + "/nvme", CapacityBytes: nvme.MinCapacity, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	r := newGPURigStore(t, 1<<20, 1<<20, store)
	g := r.gs.GPUs[0]
	keys := []Key{chainKey(5, 1), chainKey(5, 2), chainKey(5, 3)}
	for _, k := range keys {
		if at := r.put(t, k, 0); at != g.Slots {
			t.Fatalf("%v not put on the GPU", k)
		}
	}
	lease, ok := g.Slots.Acquire(keys[0]) // a device reader's lease
	if !ok {
		t.Fatal("no GPU lease")
	}

	gone, cancel := context.WithCancel(ctx)
	cancel()
	if n, err := r.gs.Flush(gone); n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("Flush with its context ended = %d, %v; want 0, context.Canceled", n, err)
	}
	for _, k := range keys {
		if r.h.Present(k) {
			t.Fatalf("%v written down after the context ended", k)
		}
	}

	if n, err := r.gs.Flush(ctx); n != len(keys) || err != nil {
		t.Fatalf("Flush = %d, %v; want %d, nil", n, err, len(keys))
	}
	for _, k := range keys {
		r.mustHold(t, r.h, k, "host")
		r.mustHold(t, g.Slots, k, "GPU")
	}
	if err := g.Slots.Release(lease); err != nil {
		t.Fatalf("the lease held across Flush: %v", err)
	}

	// Copies below already: the host's, then NVMe's alone.
	if n, err := r.gs.Flush(ctx); n != 0 || err != nil {
		t.Fatalf("Flush of blocks the host tier holds = %d, %v; want 0, nil", n, err)
	}
	if n, err := r.c.Flush(ctx); n != len(keys) || err != nil {
		t.Fatalf("chain Flush = %d, %v; want %d, nil", n, err, len(keys))
	}
	for _, k := range keys {
		hd, ok := r.h.Pin(k)
		if !ok {
			t.Fatalf("%v left the host tier", k)
		}
		if dropped, err := r.h.Unpin(hd, true); !dropped || err != nil {
			t.Fatalf("drop %v from the host tier: %v, %v", k, dropped, err)
		}
	}
	if n, err := r.gs.Flush(ctx); n != 0 || err != nil {
		t.Fatalf("Flush of blocks NVMe holds = %d, %v; want 0, nil", n, err)
	}
	for _, k := range keys {
		if r.h.Present(k) {
			t.Fatalf("%v copied into the host tier though NVMe holds it", k)
		}
	}
}
