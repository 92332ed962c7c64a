package nvme

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestSmallBlocksDoNotWedgeTheStore: a block is charged its payload plus
// blockOverhead, but it takes its payload padded to the direct-I/O
// alignment on disk. Blocks much smaller than the alignment fill the disk
// while the charged bytes stay under the logical limit's floor (C/8), so
// the penalty cannot make eviction free anything: every later Put is
// refused with ErrNoSpace, for good. Before the fix the store wedged after
// about 15,400 Puts of 100-byte blocks (4 KiB alignment).
func TestSmallBlocksDoNotWedgeTheStore(t *testing.T) {
	const capacity = 64 << 20
	dir := filepath.Join(t.TempDir(), "nvme")
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: capacity, Logger: quietLogger(), GCInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Logf("offset alignment %d", s.segs.offAlign)
	const blk = 100
	refusedInARow := 0
	i := uint64(0)
	for ; i < 30000 && refusedInARow < 5; i++ {
		k := testKey(3, i)
		err := s.Put(k, payloadFor(k, blk))
		switch {
		case err == nil:
			refusedInARow = 0
		case errors.Is(err, ErrNoSpace):
			refusedInARow++
		default:
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if refusedInARow >= 5 {
		t.Fatalf("after %d Puts of %d-byte blocks the last %d were refused: %d blocks, %d charged bytes, logical limit %d, disk %d of %d",
			i, blk, refusedInARow, st.Blocks, st.Bytes+int64(st.Blocks)*blockOverhead, st.LogicalLimit, storeUsage(dir), capacity)
	}
	t.Logf("%d blocks, limit %d, disk %d", st.Blocks, st.LogicalLimit, storeUsage(dir))
	if bad := checkInvariants(s); len(bad) > 0 {
		t.Fatalf("invariants: %v", bad)
	}
}
