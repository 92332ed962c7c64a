package nvme

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestReopenWithSmallerCapacity: a store reopened with a smaller capacity
// (the operator lowered nvme.capacity and restarted) is brought under the
// new budget at Open, as SetCapacity does for a reload: the least recently
// written blocks are evicted down to the logical limit before Open returns
// and the directory goes under the capacity within a few maintenance
// passes, without waiting for a Put or the (10 s) maintenance period.
func TestReopenWithSmallerCapacity(t *testing.T) {
	const blk = 1 << 20
	const n = 150
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 256<<20)
	for i := range uint64(n) {
		k := testKey(3, i)
		if err := s.Put(k, payloadFor(k, blk)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	const capacity = 128 << 20
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: capacity, Logger: quietLogger()}) // default GCInterval
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := s.Stats()
	if charged := st.Bytes + int64(st.Blocks)*blockOverhead; charged > st.LogicalLimit {
		t.Errorf("reopened at %d bytes (%d blocks) over its logical limit %d", charged, st.Blocks, st.LogicalLimit)
	}
	if st.Blocks > 0 {
		mustGet(t, s, testKey(3, n-1), blk) // the newest write is kept
	}
	deadline := time.Now().Add(3 * time.Second)
	for storeUsage(dir) > capacity {
		if time.Now().After(deadline) {
			t.Fatalf("3s after reopening with capacity %d the directory holds %d bytes (%d blocks)", capacity, storeUsage(dir), s.Stats().Blocks)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if bad := checkInvariants(s); len(bad) > 0 {
		t.Errorf("invariants: %v", bad)
	}
}
