//go:build !cuda

package tiers

import (
	"testing"

	"github.com/kvtier/kvtier/cudaipc"
)

// TestGPUCompactionFailureIsNoEviction: a GPU compaction copy that fails
// drops its block and is counted once, in the compaction errors
// (kvtier_gpu_compaction_errors_total); docs/metrics.md says a GPU arena's
// kvtier_tier_evictions_total stays 0 (the arena never evicts), and the drop
// used to be counted there too.
func TestGPUCompactionFailureIsNoEviction(t *testing.T) {
	r := newGPURig(t, false)
	g0 := r.gs.GPUs[0]
	fd := &failDtoD{Device: g0.Dev}
	g0.Dev = fd
	defer func() { g0.Dev = fd.Device }()
	var keys []Key
	for i := range uint64(32) { // 8 slabs of 4 blocks: the arena is full
		k := chainKey(65, i)
		hd, err := g0.Slots.Reserve(k, gpuBlock)
		if err != nil {
			t.Fatal(err)
		}
		b := blockFor(k, gpuBlock)
		if err := g0.run(func(s cudaipc.Stream) error { return g0.Dev.CopyHtoDAsync(g0.ptr(hd.Offset), b, s) }); err != nil {
			t.Fatal(err)
		}
		if err := g0.Slots.Commit(hd); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	// One hole in each of slabs 0..3: a new class's reservation drains a
	// slab, and every one of its copies fails.
	for _, i := range []int{0, 4, 8, 12} {
		if !g0.Slots.Delete(keys[i]) {
			t.Fatal("delete")
		}
	}
	before := g0.Slots.Stats()
	fd.fail.Store(true)
	hd, err := g0.Slots.Reserve(chainKey(65, 100), 2*gpuBlock)
	fd.fail.Store(false)
	if err != nil {
		t.Fatalf("reserve of another class: %v", err)
	}
	g0.Slots.Abort(hd)
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
