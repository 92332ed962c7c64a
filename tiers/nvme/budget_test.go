package nvme

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestDiskBudget writes three times the capacity and checks that the
// directory's allocated size never exceeds the capacity, old blocks are
// evicted and new ones are present.
func TestDiskBudget(t *testing.T) {
	const capacity = 128 << 20
	const blk = 256 << 10
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, capacity)
	defer s.Close()
	total := 3 * capacity / blk
	var peak int64
	noSpace := 0
	for i := range uint64(total) {
		k := testKey(4, i)
		err := s.Put(k, payloadFor(k, blk))
		if errors.Is(err, ErrNoSpace) {
			noSpace++
		} else if err != nil {
			t.Fatal(err)
		}
		if i%16 == 0 {
			if d := storeUsage(dir); d > peak {
				peak = d
			}
		}
	}
	// Let a maintenance pass run, then measure.
	time.Sleep(500 * time.Millisecond)
	final := storeUsage(dir)
	st := s.Stats()
	t.Logf("capacity %d MiB: peak %.1f MiB, final %.1f MiB, logical %.1f MiB in %d blocks, limit %.1f MiB; evictions %d, GC runs %d, ErrNoSpace %d",
		capacity>>20, float64(peak)/(1<<20), float64(final)/(1<<20), float64(st.Bytes)/(1<<20), st.Blocks,
		float64(st.LogicalLimit)/(1<<20), st.Evictions, st.GCRuns, noSpace)
	if peak > capacity || final > capacity {
		t.Fatalf("disk usage over capacity: peak %d final %d > %d", peak, final, capacity)
	}
	if noSpace > total/20 {
		t.Fatalf("%d of %d Puts rejected", noSpace, total)
	}
	for i := range uint64(total / 4) {
		if s.Contains(testKey(4, i)) {
			t.Fatalf("old block %d still present", i)
		}
	}
	for i := uint64(total) - 32; i < uint64(total); i++ {
		mustGet(t, s, testKey(4, i), blk)
	}
	// Deleting everything gives the space back.
	if _, err := s.DeleteNS(4); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for storeUsage(dir) > capacity/4 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if d := storeUsage(dir); d > capacity/4 {
		t.Fatalf("after DeleteNS the directory still holds %.1f MiB", float64(d)/(1<<20))
	}
}

// storeUsage is the allocated size of the store: badger's files and the
// segment files.
func storeUsage(dir string) int64 { return dirUsage(dir) + dirUsage(filepath.Join(dir, segDirName)) }
