//go:build !cuda

package tiers

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/cudaipc"
)

// newGPURigSlabs is newGPURigN(t, 1, false) with its own slab sizes for the
// host tier and the GPU arena.
func newGPURigSlabs(t *testing.T, hostSlab, gpuSlab int64) *gpuRig {
	t.Helper()
	t.Setenv(cudaipc.EnvEmulatedGPUs, "1:64MiB")
	devs, err := cudaipc.Devices()
	if err != nil {
		t.Fatal(err)
	}
	arena, err := unix.Mmap(-1, 0, 32<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(arena, HostConfig{SlabBytes: hostSlab})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewChain(h, nil, ChainConfig{Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	gs, err := NewGPUSet(c, arena, devs, []int64{gpuArena}, GPUConfig{
		SlabBytes: gpuSlab, HighWatermark: 0.75, LowWatermark: 0.5, Workers: 2, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	_, cancel := context.WithCancel(context.Background())
	r := &gpuRig{gs: gs, c: c, h: h, cancel: cancel}
	t.Cleanup(func() {
		cancel()
		gs.Close()
		unix.Munmap(arena)
	})
	return r
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
