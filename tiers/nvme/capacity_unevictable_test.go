package nvme

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestCapacityBelowUnevictableThenBack: a reload lowers nvme.capacity
// below the parked (unevictable) bytes, which no eviction can bring under
// the new budget, so every maintenance pass finds the directory over its
// soft cap. The adaptive penalty must not keep growing with each pass: it
// cannot evict a parked block, and once the capacity is raised back the
// penalty accumulated meanwhile held the logical limit at its floor (C/8),
// so Puts of ordinary blocks the disk had room for failed (ErrNoSpace:
// the parked blocks alone were over the limit) or were evicted, for as
// long as the penalty took to decay.
func TestCapacityBelowUnevictableThenBack(t *testing.T) {
	const capacity = 256 << 20
	const blk = 1 << 20
	dir := filepath.Join(t.TempDir(), "nvme")
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: capacity, Logger: quietLogger(), GCInterval: time.Hour,
		Unevictable: func(k Key) bool { return k.NS == 1 }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const parked = 96
	for i := range uint64(parked) {
		k := testKey(1, i)
		if err := s.Put(k, payloadFor(k, blk)); err != nil {
			t.Fatal(err)
		}
	}
	low := max(MinCapacity, 4*s.segFileSize)
	if err := s.SetCapacity(low); err != nil {
		t.Fatal(err)
	}
	// The lowered budget stays in force for a while: maintenance passes
	// (every GCInterval, 10s by default, and on every refused Put).
	for range 50 {
		s.maintain(context.Background())
	}
	if err := s.SetCapacity(capacity); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	t.Logf("raised back: limit %d MiB (base %d MiB), unevictable %d MiB, disk %d MiB",
		st.LogicalLimit>>20, LogicalLimitFor(capacity)>>20, st.UnevictableBytes>>20, storeUsage(dir)>>20)
	// 64 ordinary blocks: with the 96 parked ones well under the budget.
	const more = 64
	for i := range uint64(more) {
		k := testKey(2, i)
		if err := s.Put(k, payloadFor(k, blk)); err != nil {
			t.Fatal(err)
		}
	}
	lost := 0
	for i := range uint64(more) {
		if !s.Contains(testKey(2, i)) {
			lost++
		}
	}
	if lost > 0 {
		st := s.Stats()
		t.Fatalf("%d of %d ordinary blocks evicted under a budget with room for them: limit %d MiB (base %d MiB), logical %d MiB, disk %d MiB",
			lost, more, st.LogicalLimit>>20, LogicalLimitFor(capacity)>>20, st.Bytes>>20, storeUsage(dir)>>20)
	}
}
