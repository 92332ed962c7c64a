//go:build !cuda

package tiers

import (
	"testing"
)

// TestGPUCompactionFailureIsNoEviction: a GPU compaction copy that fails
// drops its block and is counted once, in the compaction errors
// (kvtier_gpu_compaction_errors_total); docs/metrics.md says a GPU arena's
// kvtier_tier_evictions_total stays 0 (the arena never evicts), and the drop
// used to be counted there too.
func TestGPUCompactionFailureIsNoEviction(t *testing.T) {
	r := newGPURig(t, false)
	g0 := r.gs.GPUs[0]
	_, _, compact := failingCompaction(t, r, 65)
	before := g0.Slots.Stats()
	compact()
	after := g0.Slots.Stats()
	dropped := before.Blocks - after.Blocks
	errs := r.gs.Stats().CompactErrors
	if errs == 0 || dropped == 0 {
		t.Fatalf("compaction errors %d, blocks dropped %d: the test did not fail a compaction copy", errs, dropped)
	}
	if uint64(dropped) != errs {
		t.Errorf("%d blocks dropped, %d compaction errors counted: want one each", dropped, errs)
	}
	if d := after.Evictions - before.Evictions; d != 0 {
		t.Errorf("GPU arena evictions rose by %d after failed compaction copies, want 0 (a GPU arena never evicts)", d)
	}
}
