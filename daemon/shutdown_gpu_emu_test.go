//go:build linux && !cuda

package daemon

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// gpuPut stores b as k in GPU 0's arena of d, as a device put does
// (reserved, copied host → device, committed), and fails unless it landed
// on the GPU.
func gpuPut(t *testing.T, d *Daemon, k tiers.Key, b []byte) {
	t.Helper()
	hd, err := d.gpus.Reserve(k, int64(len(b)), 0)
	if err != nil {
		t.Fatalf("reserve %v: %v", k.Hash, err)
	}
	g := d.gpus.GPUOf(hd)
	if g == nil {
		t.Fatalf("%v reserved in the host tier, want GPU 0", k.Hash)
	}
	s, err := g.Dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := g.Dev.CopyHtoDAsync(g.Arena.Ptr()+cudaipc.DevicePtr(hd.Offset), b, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := g.Slots.Commit(hd); err != nil {
		t.Fatal(err)
	}
	d.gpus.Committed(g)
}

// TestStopWritesGPUBlocksDown: with nvme.flush_on_stop, a clean stop
// writes the GPU-only blocks down too, not only the host tier: they are
// the hottest, and a restart on the same state dir must find them in
// NVMe, byte-exact. It used to lose every block held only on a GPU.
func TestStopWritesGPUBlocksDown(t *testing.T) {
	if !cudaipc.Emulated {
		t.Skip("needs the emulated GPU build")
	}
	for _, tc := range []struct {
		name     string
		blockLen int
		onGPU    int // blocks put on the GPU only (after 2 through the host API)
	}{
		{"fits the host tier", 256 * KiB, 8},
		// 12MiB on the GPU (under its high watermark), the host tier
		// 8MiB: writing them into it must push host blocks to NVMe.
		{"more than the host tier", 512 * KiB, 24},
	} {
		t.Run(tc.name, func(t *testing.T) { testStopWritesGPUBlocksDown(t, tc.blockLen, tc.onGPU) })
	}
}

func testStopWritesGPUBlocksDown(t *testing.T, bs, onGPU int) {
	t.Setenv(cudaipc.EnvEmulatedGPUs, "1:64MiB")
	cfg := testConfig(t) // host tier 8MiB
	cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 64*MiB, true
	cfg.GPU.Enabled, cfg.GPU.ArenaBytes, cfg.GPU.SlabBytes = true, 16*MiB, MiB
	ctx := context.Background()

	r := startDaemon(t, cfg, nil)
	if r.d.gpus == nil {
		t.Fatal("GPU tier off with an emulated GPU")
	}
	c, err := client.Dial(ctx, client.Options{Socket: cfg.Socket, Name: "gpu-flush"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Open(ctx, testNamespace(bs))
	if err != nil {
		t.Fatal(err)
	}
	ns := s.NamespaceID()
	// Two blocks through the host API (the host tier's write-down), the
	// rest only on the GPU, under its high watermark (the demoter leaves
	// them there).
	hs := testBlocks(11, 2+onGPU)
	for _, h := range hs[:2] {
		if _, err := s.Put(ctx, h, block(h, bs)); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range hs[2:] {
		gpuPut(t, r.d, tiers.Key{NS: ns, Hash: h}, block(h, bs))
	}
	for _, h := range hs[2:] {
		k := tiers.Key{NS: ns, Hash: h}
		if !r.d.gpus.GPUs[0].Slots.Contains(k) || r.d.host.Contains(k) || r.d.nvme.Contains(nvme.Key{NS: ns, Hash: h}) {
			t.Fatalf("%v: not only on the GPU before the stop", h)
		}
	}
	c.Close()
	r.stop(t)

	cfg.GPU.Enabled = false // the restarted daemon has the chain alone
	r2 := startDaemon(t, cfg, nil)
	for i, h := range hs {
		if !r2.d.nvme.Contains(nvme.Key{NS: ns, Hash: h}) {
			t.Errorf("block %d (put %s) not in NVMe after a clean stop with flush_on_stop", i, map[bool]string{true: "to the host", false: "on the GPU"}[i < 2])
		}
	}
	c2, err := client.Dial(ctx, client.Options{Socket: cfg.Socket, Name: "gpu-flush-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	s2, err := c2.Open(ctx, testNamespace(bs))
	if err != nil {
		t.Fatal(err)
	}
	if s2.NamespaceID() != ns {
		t.Fatalf("namespace id %d after the restart, was %d", s2.NamespaceID(), ns)
	}
	dst := make([]byte, bs)
	for i, h := range hs {
		if err := s2.Get(ctx, h, dst); err != nil {
			t.Errorf("get block %d after the restart: %v", i, err)
			continue
		}
		if !bytes.Equal(dst, block(h, bs)) {
			t.Errorf("block %d: bytes differ after the restart", i)
		}
	}
}
