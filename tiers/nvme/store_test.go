package nvme

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func quietLogger() *slog.Logger {
	if os.Getenv("NVME_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func openT(t testing.TB, dir string, capacity int64) *Store {
	t.Helper()
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: capacity, Logger: quietLogger(), GCInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func mustGet(t testing.TB, s *Store, k Key, size int) {
	t.Helper()
	dst := make([]byte, size)
	n, err := s.Get(k, dst)
	if err != nil {
		t.Fatalf("Get %v: %v", k, err)
	}
	if n != size || !bytes.Equal(dst[:n], payloadFor(k, size)) {
		t.Fatalf("Get %v: wrong bytes (n=%d want %d)", k, n, size)
	}
}

func TestPutGetDelete(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 256<<20)
	defer s.Close()
	sizes := []int{0, 1, 31, 32, 4096, 65536, 65536 + 7, 2 << 20, 8 << 20}
	for i, sz := range sizes {
		k := testKey(1, uint64(i))
		if err := s.Put(k, payloadFor(k, sz)); err != nil {
			t.Fatalf("Put size %d: %v", sz, err)
		}
	}
	for i, sz := range sizes {
		k := testKey(1, uint64(i))
		if !s.Contains(k) {
			t.Fatalf("Contains(%d) false", i)
		}
		mustGet(t, s, k, sz)
	}
	// Short buffer reports the size.
	k7 := testKey(1, 7)
	if n, err := s.Get(k7, make([]byte, 10)); !errors.Is(err, ErrShortBuffer) || n != 2<<20 {
		t.Fatalf("short Get: n=%d err=%v", n, err)
	}
	// Overwrite with a different size.
	if err := s.Put(k7, payloadFor(k7, 1000)); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, k7, 1000)
	// Delete and miss.
	if err := s.Delete(k7); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(k7, make([]byte, 1000)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	if err := s.Delete(k7); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if err := s.Put(testKey(2, 1), []byte("x")); err != nil {
		t.Fatal(err)
	}
	// Keys: LRU order, sizes.
	n := 0
	s.Keys(func(k Key, size int64) bool { n++; return true })
	if n != len(sizes) { // 9 - deleted + ns2
		t.Fatalf("Keys visited %d, want %d", n, len(sizes))
	}
	got, err := s.DeleteNS(1)
	if err != nil || got != len(sizes)-1 {
		t.Fatalf("DeleteNS: %d %v", got, err)
	}
	if s.Contains(testKey(1, 0)) || !s.Contains(testKey(2, 1)) {
		t.Fatal("DeleteNS removed the wrong keys")
	}
	if _, err := s.Get(testKey(1, 8), make([]byte, 8<<20)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after DeleteNS: %v", err)
	}
	if err := s.Put(testKey(1, 99), make([]byte, s.MaxBlockBytes()+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized Put: %v", err)
	}
	st := s.Stats()
	if st.Blocks != 1 || st.Puts != uint64(len(sizes)+2) || st.Hits == 0 || st.Misses < 2 {
		t.Fatalf("stats: %+v", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(testKey(1, 1), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	// DeleteNS survives a restart.
	s2 := openT(t, dir, 256<<20)
	defer s2.Close()
	if st := s2.Stats(); st.Blocks != 1 || st.ReindexBlocks != 1 {
		t.Fatalf("after reopen: %+v", st)
	}
}

// TestReindexExactSizes pins sizeFromValueSize against the badger in go.mod
// and checks that recency order survives a restart as write order.
func TestReindexExactSizes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 512<<20)
	var sizes []int
	for _, base := range []int{0, 1, 32, 90, 91, 92, 93, 127, 128, 16384 - 40, 16384 - 36, 16384 - 35, 65536, 2 << 20, 2097152 - 37, 2097152 - 36, 2097152 - 35, 8 << 20} {
		for d := -2; d <= 2; d++ {
			if base+d >= 0 {
				sizes = append(sizes, base+d)
			}
		}
	}
	for i, sz := range sizes {
		k := testKey(3, uint64(i))
		if err := s.Put(k, payloadFor(k, sz)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, 512<<20)
	defer s.Close()
	i := 0
	s.Keys(func(k Key, size int64) bool {
		if k != testKey(3, uint64(i)) {
			t.Fatalf("LRU order after restart: position %d holds %v", i, k)
		}
		if size != int64(sizes[i]) {
			t.Fatalf("reindexed size of block %d: %d, want %d", i, size, sizes[i])
		}
		i++
		return true
	})
	if i != len(sizes) {
		t.Fatalf("reindexed %d blocks, want %d", i, len(sizes))
	}
	for i, sz := range sizes {
		mustGet(t, s, testKey(3, uint64(i)), sz)
	}
}

func TestLockedDirNotMovedAside(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	defer s.Close()
	_, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: 64 << 20, Logger: quietLogger()})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v", err)
	}
	if m, _ := filepath.Glob(dir + ".corrupt-*"); len(m) != 0 {
		t.Fatalf("locked dir was moved aside: %v", m)
	}
}

func TestConcurrentOps(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	defer s.Close()
	const workers = 6
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var wrong, puts, gets int64
	var mu sync.Mutex
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, 512<<10)
			bufs := make([][]byte, 4)
			for j := range bufs {
				bufs[j] = alignedBuf(512 << 10)
			}
			var p, g int64
			for i := uint64(0); time.Now().Before(deadline); i++ {
				k := testKey(uint32(w%2), (i*7+uint64(w))%300)
				size := 16<<10 + int(k.Hash.Lo%16)*(16<<10)
				switch i % 5 {
				case 0, 1:
					if err := s.Put(k, payloadFor(k, size)); err != nil && !errors.Is(err, ErrNoSpace) {
						t.Errorf("Put: %v", err)
						return
					}
					p++
				case 3:
					// A batch of this key and its neighbours, often written
					// back to back by the other workers.
					var ks []Key
					for j := range uint64(4) {
						ks = append(ks, testKey(uint32(w%2), ((i+j)*7+uint64(w))%300))
					}
					ns, errs := s.GetBatch(ks, bufs)
					for j, k := range ks {
						if err := errs[j]; err == nil {
							g++
							size := 16<<10 + int(k.Hash.Lo%16)*(16<<10)
							if ns[j] != size || !bytes.Equal(bufs[j][:size], payloadFor(k, size)) {
								mu.Lock()
								wrong++
								mu.Unlock()
							}
						} else if !errors.Is(err, ErrNotFound) {
							t.Errorf("GetBatch: %v", err)
							return
						}
					}
				case 2:
					n, err := s.Get(k, dst)
					if err == nil {
						g++
						if n != size || !bytes.Equal(dst[:n], payloadFor(k, size)) {
							mu.Lock()
							wrong++
							mu.Unlock()
						}
					} else if !errors.Is(err, ErrNotFound) {
						t.Errorf("Get: %v", err)
						return
					}
					s.Contains(k)
				case 4:
					if err := s.Delete(k); err != nil {
						t.Errorf("Delete: %v", err)
						return
					}
					if i%97 == 0 {
						if _, err := s.DeleteNS(uint32(w % 2)); err != nil {
							t.Errorf("DeleteNS: %v", err)
						}
					}
				}
				if i%50 == 0 {
					s.Stats()
					s.Keys(func(Key, int64) bool { return false })
				}
			}
			mu.Lock()
			puts += p
			gets += g
			mu.Unlock()
		}()
	}
	wg.Wait()
	if wrong != 0 {
		t.Fatalf("%d reads returned wrong bytes", wrong)
	}
	st := s.Stats()
	t.Logf("puts=%d hits=%d stats=%+v", puts, gets, st)
	if st.ChecksumMisses != 0 {
		t.Fatalf("checksum misses without corruption: %d", st.ChecksumMisses)
	}
	if bad := checkInvariants(s); len(bad) > 0 {
		t.Fatalf("index, badger and segments disagree:\n%v", bad)
	}
	// Index agrees with disk after a restart. Open wakes a maintenance
	// pass when the disk is over its soft cap, which may evict: wait for
	// it, and count what it evicted.
	blocks := st.Blocks
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openT(t, dir, 64<<20)
	defer s2.Close()
	waitPasses(s2, 2)
	if st2 := s2.Stats(); st2.Blocks+int(st2.Evictions) != blocks {
		t.Fatalf("after restart: %d blocks and %d evictions, index had %d", st2.Blocks, st2.Evictions, blocks)
	}
	s2.Keys(func(k Key, size int64) bool {
		mustGet(t, s2, k, int(size))
		return true
	})
}

func TestMain_noLeftovers(t *testing.T) {
	// A store whose directory disappears still closes cleanly.
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	if err := s.Put(testKey(1, 1), payloadFor(testKey(1, 1), 1000)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir + ".lock"); err != nil {
		t.Fatalf("lock file: %v", err)
	}
}

// TestUnevictableBytes: the store sums the sizes of the blocks its
// Unevictable marks (parked requests: the tier chain caps them) through
// every way a block comes and goes, and again from disk at Open.
func TestUnevictableBytes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	open := func() *Store {
		s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: 64 << 20, Logger: quietLogger(),
			Unevictable: func(k Key) bool { return k.NS == 9 }})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	}
	s := open()
	check := func(when string, want int64) {
		t.Helper()
		if got := s.UnevictableBytes(); got != want {
			t.Fatalf("%s: UnevictableBytes %d, want %d", when, got, want)
		}
		if got := s.Stats().UnevictableBytes; got != want {
			t.Fatalf("%s: Stats().UnevictableBytes %d, want %d", when, got, want)
		}
	}
	put := func(k Key, size int) {
		t.Helper()
		if err := s.Put(k, payloadFor(k, size)); err != nil {
			t.Fatal(err)
		}
	}
	for i, sz := range []int{1000, 2000, 3000} {
		put(testKey(9, uint64(i)), sz)
		put(testKey(1, uint64(i)), 7000)
	}
	check("after puts", 6000)
	put(testKey(9, 0), 500) // overwritten smaller
	check("after an overwrite", 5500)
	if err := s.Delete(testKey(9, 1)); err != nil {
		t.Fatal(err)
	}
	check("after a delete", 3500)
	if _, err := s.DeleteNS(1); err != nil { // ordinary blocks only
		t.Fatal(err)
	}
	check("after deleting another namespace", 3500)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	check("after a reopen", 3500)
	if _, err := s.DeleteNS(9); err != nil {
		t.Fatal(err)
	}
	check("after deleting their namespace", 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
