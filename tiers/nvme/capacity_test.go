package nvme

import (
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSetCapacity fills a store near its capacity, halves the capacity
// while writers keep putting (run with -race), and checks that the logical
// bytes and the directory's allocated size go under the new budget within
// a bounded time; growing it back lets more blocks in.
func TestSetCapacity(t *testing.T) {
	const capacity = 128 << 20
	const blk = 256 << 10
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, capacity)
	defer s.Close()

	for _, bad := range []int64{0, MinCapacity - 1, 4*s.segFileSize - 1} {
		if err := s.SetCapacity(bad); err == nil {
			t.Errorf("SetCapacity(%d) accepted", bad)
		}
	}
	var next atomic.Uint64
	put := func() error {
		k := testKey(5, next.Add(1))
		err := s.Put(k, payloadFor(k, blk))
		if errors.Is(err, ErrNoSpace) {
			return nil // transient while the store shrinks
		}
		return err
	}
	for range capacity / blk {
		if err := put(); err != nil {
			t.Fatal(err)
		}
	}
	full := s.Stats()
	t.Logf("full: logical %d MiB in %d blocks, disk %d MiB", full.Bytes>>20, full.Blocks, storeUsage(dir)>>20)

	// Concurrent writers while the budget shrinks.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := put(); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	const half = capacity / 2
	if err := s.SetCapacity(half); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Capacity != half || st.LogicalLimit > half {
		t.Fatalf("after SetCapacity(%d): capacity %d logical limit %d", half, st.Capacity, st.LogicalLimit)
	}
	waitUnder := func(budget int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st := s.Stats()
			disk := storeUsage(dir)
			if st.Bytes <= budget && disk <= budget {
				t.Logf("under %d MiB: logical %d MiB, disk %d MiB, limit %d MiB", budget>>20, st.Bytes>>20, disk>>20, st.LogicalLimit>>20)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("10s after SetCapacity(%d): logical %d, disk %d, limit %d", budget, st.Bytes, disk, st.LogicalLimit)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitUnder(half)
	close(stop)
	wg.Wait()
	waitUnder(half)
	shrunk := s.Stats()

	// Growing lets more blocks in.
	if err := s.SetCapacity(capacity); err != nil {
		t.Fatal(err)
	}
	for range capacity / blk {
		if err := put(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	grown := s.Stats()
	if grown.Capacity != capacity || grown.Bytes <= shrunk.LogicalLimit || grown.Blocks <= shrunk.Blocks {
		t.Fatalf("after growing back: %d bytes in %d blocks (capacity %d); at half: %d bytes in %d blocks, limit %d",
			grown.Bytes, grown.Blocks, grown.Capacity, shrunk.Bytes, shrunk.Blocks, shrunk.LogicalLimit)
	}
	if d := storeUsage(dir); d > capacity {
		t.Fatalf("disk %d over the grown capacity %d", d, capacity)
	}
}
