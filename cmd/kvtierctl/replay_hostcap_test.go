package main

import (
	"context"
	"testing"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
	"github.com/kvtier/kvtier/tiers/trace"
)

// replay's "host tier holds N blocks" (host_capacity_blocks), the figure an
// operator passes to --simulate --capacity-blocks, was capacity / stride:
// it ignored that a slab holds whole blocks only (32 MiB of 16 MiB slabs
// holds 4 blocks of 6 MiB, not 5) and that above an NVMe tier the host
// tier keeps at most its high watermark (1945 blocks of 16 KiB of 32 MiB
// at 0.95, not 2048), as plan counts them.
func TestReplayHostTierHoldsBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts daemons")
	}
	for _, c := range []struct {
		name  string
		nvme  bool
		block string
		bytes int
		want  int64
	}{
		{"whole blocks per slab", false, "6MiB", 6 << 20, 4},
		{"high watermark above nvme", true, "16KiB", 16 << 10, 1945},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock, _ := startDaemonIn(t, t.TempDir(), func(cfg *daemon.Config) {
				cfg.Host.SlabBytes = 16 << 20
				cfg.Host.Capacity = 32 << 20
				cfg.Host.HighWatermark = 0.95
				cfg.NVMe.Enabled = c.nvme
				if c.nvme {
					cfg.NVMe.Capacity = 256 << 20
				}
			})
			// More distinct blocks than the tier holds.
			var reqs []trace.Request
			for i := range int(c.want) + 2 {
				reqs = append(reqs, trace.Request{Timestamp: int64(i), InputLength: trace.BlockTokens, HashIDs: []int64{int64(i)}})
			}
			res := replayJSON(t, "--socket", sock, "--block-size", c.block, "--fresh", writeTrace(t, reqs))
			if res.HostCapBlocks != c.want {
				t.Errorf("host tier holds %d blocks of %s, want %d", res.HostCapBlocks, c.block, c.want)
			}
			if c.nvme {
				return // the mover demotes in the background
			}
			// Without NVMe the tier fills to what it holds, synchronously.
			cl, err := client.Dial(context.Background(), client.Options{Socket: sock, Name: "kvtierctl-test"})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			st, err := cl.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if h := hostTier(st); h == nil || int64(h.Blocks) != c.want {
				t.Errorf("host tier status: %+v; want %d blocks", h, c.want)
			}
		})
	}
}
