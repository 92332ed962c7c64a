//go:build !cuda

package tiers

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/cudaipc"
)

// TestGPUDemoterCountsSlabWaste: blocks of 600 KiB take a 1 MiB GPU slab
// each, so a full arena holds 58.6% of its bytes in blocks, under the low
// watermark (0.8). A device put that finds no slot falls back to the host
// tier and asks the demoter for room; the demoter must free slots, else
// the oldest blocks hold the GPU forever and every later device put goes to
// the host tier.
func TestGPUDemoterCountsSlabWaste(t *testing.T) {
	const bs = 600 << 10
	t.Setenv(cudaipc.EnvEmulatedGPUs, "1:64MiB")
	devs, err := cudaipc.Devices()
	if err != nil {
		t.Fatal(err)
	}
	arena, err := unix.Mmap(-1, 0, 32<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(arena, HostConfig{SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewChain(h, nil, ChainConfig{Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	gs, err := NewGPUSet(c, arena, devs, []int64{8 << 20}, GPUConfig{
		SlabBytes: 1 << 20, HighWatermark: 0.9, LowWatermark: 0.8, Workers: 2, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	gs.Start(ctx)
	t.Cleanup(func() {
		cancel()
		gs.Wait()
		c.Wait()
		gs.Close()
		unix.Munmap(arena)
	})
	g := gs.GPUs[0]
	put := func(k Key) *Host {
		t.Helper()
		hd, err := gs.Reserve(k, bs, 0)
		if err != nil {
			t.Fatalf("reserve %v: %v", k, err)
		}
		if gg := gs.GPUOf(hd); gg != nil {
			if err := gg.Slots.Commit(hd); err != nil {
				t.Fatal(err)
			}
			gs.Committed(gg)
			return gg.Slots
		}
		if err := h.Commit(hd); err != nil {
			t.Fatal(err)
		}
		return h
	}
	fell := -1 // one block per slab: the 9th cannot fit
	for i := range 9 {
		if at := put(chainKey(61, uint64(i))); at == h {
			fell = i
			break
		}
	}
	if fell < 0 {
		t.Fatal("9 blocks of a slab each went to an arena of 8 slabs")
	}
	deadline := time.Now().Add(3 * time.Second)
	for g.demoted.Load() == 0 || !g.hasRoom(bs) {
		if time.Now().After(deadline) {
			used, capacity := g.Slots.Usage()
			t.Fatalf("GPU arena full (%d blocks, %d of %d bytes in blocks) after a put fell back, and the demoter made no room",
				g.Slots.Stats().Blocks, used, capacity)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if at := put(chainKey(61, 100)); at != g.Slots {
		used, capacity := g.Slots.Occupied()
		t.Fatalf("the next device put fell back to the host tier too (GPU %d of %d bytes taken, %d blocks)", used, capacity, g.Slots.Stats().Blocks)
	}
}
