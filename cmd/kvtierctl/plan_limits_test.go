package main

import (
	"math"
	"testing"
)

// TestPlanHighWatermarkHugeTier: the share of a tier under its high
// watermark was computed as uint64(high × float64(capacity)); for a
// capacity near 2^64 the product rounds up to 2^64, which converts to
// 2^63 on amd64: with a watermark of 1, a 16 EiB host or GPU tier was
// planned at half its blocks. (Both tiers are slab allocators, and a full
// host tier is above any watermark: see slabKeepsBlocks.)
func TestPlanHighWatermarkHugeTier(t *testing.T) {
	const block = 2 * mib
	// Whole 64 MiB slabs of 32 blocks each: (2^38 - 1) × 32.
	const hostBlocks = (math.MaxUint64 / (64 * mib)) * 32
	tests := []struct {
		name      string
		gpu, host uint64
		tier      string
		want      uint64
	}{
		{"host above nvme, watermark 1", 0, math.MaxUint64, "host", hostBlocks - 1},
		{"gpu, watermark 1", math.MaxUint64, 0, "gpu", hostBlocks},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := computePlan(planInput{Model: preset(t, "llama-3-8b"), DType: "bf16", TP: 1, TokensPerBlock: 16,
				Concurrency: 1, AvgContext: 16, GPUBytes: tt.gpu, HostBytes: tt.host, NVMeBytes: 64 * gib,
				HostHigh: 1, GPUHigh: 1})
			if err != nil {
				t.Fatal(err)
			}
			if r.BlockBytes != block {
				t.Fatalf("block of %d bytes, want %d", r.BlockBytes, block)
			}
			for _, tier := range r.Tiers {
				if tier.Name == tt.tier && tier.BlocksFit != tt.want {
					t.Errorf("%s tier of %d bytes: %d blocks fit, want %d", tier.Name, tier.CapacityBytes, tier.BlocksFit, tt.want)
				}
			}
		})
	}
}
