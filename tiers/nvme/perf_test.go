package nvme

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	badger "github.com/dgraph-io/badger/v4"
	"golang.org/x/sys/unix"
)

var (
	flagReindex1M = flag.Bool("nvme.reindex1m", false, "write 1M small blocks, reopen, report the key-only reindex time")
	flagOptBench  = flag.Bool("nvme.optbench", false, "compare badger option sets for the index (2 MiB and 64 KiB blocks; see -nvme.rawbench for the raw-I/O comparison)")
	flagBenchDir  = flag.String("nvme.benchdir", "", "directory for -nvme.optbench (default: a temp dir)")
)

func TestReindex1M(t *testing.T) {
	if !*flagReindex1M {
		t.Skip("enable with -nvme.reindex1m")
	}
	const n = 1 << 20
	// Each block's record takes a direct-I/O unit (4 KiB) of a segment:
	// 1M blocks need 4 GiB of disk whatever their size.
	const reindexCap = 8 << 30
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, reindexCap)
	start := time.Now()
	var wg sync.WaitGroup
	const workers = 16
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64)
			for i := uint64(w); i < n; i += workers {
				k := testKey(1, i)
				fillFor(k, buf)
				if err := s.Put(k, buf); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("wrote %d blocks in %v; %+v", n, time.Since(start), s.Stats())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = nil
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	openStart := time.Now()
	s = openT(t, dir, reindexCap)
	opened := time.Since(openStart)
	defer s.Close()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	st := s.Stats()
	if st.ReindexBlocks != n {
		t.Fatalf("reindexed %d, want %d", st.ReindexBlocks, n)
	}
	t.Logf("OPEN 1M: %v in all (badger's open, the table check, the reindex)", opened)
	t.Logf("REINDEX 1M: %d blocks in %v (%.0f ns/block); heap after open %+.1f MiB (%.0f B/block incl. badger tables' index+bloom); entry %d B",
		st.ReindexBlocks, st.ReindexDuration, float64(st.ReindexDuration.Nanoseconds())/n,
		float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc))/(1<<20), float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc))/n,
		unsafe.Sizeof(entry{}))
	mustGet(t, s, testKey(1, 12345), 64)
}

type optSet struct {
	name string
	sync bool
	tune func(*badger.Options)
}

func TestOptionSets(t *testing.T) {
	if !*flagOptBench {
		t.Skip("enable with -nvme.optbench")
	}
	base := *flagBenchDir
	if base == "" {
		base = t.TempDir()
	} else {
		base, _ = os.MkdirTemp(base, "nvmebench")
		defer os.RemoveAll(base)
	}
	sets := []optSet{
		{name: "kvtier (chosen)"},
		{name: "kvtier + SyncWrites", sync: true},
		{name: "badger defaults", tune: func(o *badger.Options) {
			d := badger.DefaultOptions(o.Dir).WithLogger(o.Logger).WithMetricsEnabled(false)
			*o = d
		}},
		{name: "chosen, 1 GiB vlog files, 64 MiB memtable", tune: func(o *badger.Options) {
			o.ValueLogFileSize = 1<<30 - 1
			o.MemTableSize = 64 << 20
		}},
	}
	for _, bs := range []int{2 << 20, 64 << 10} {
		total := int64(1 << 30)
		if bs < 1<<20 {
			total = 256 << 20
		}
		nblk := int(total / int64(bs))
		w, r := rawDirect(t, base, bs, nblk)
		wb := rawBuffered(t, base, bs, nblk)
		t.Logf("block %d KiB, %d MiB: raw O_DIRECT write %.0f MB/s, read %.0f MB/s; buffered write+fsync %.0f MB/s",
			bs>>10, total>>20, w, r, wb)
		for _, os := range sets {
			pw, pr, hot := storeRun(t, base, os, bs, nblk)
			t.Logf("  %-42s put+sync %5.0f MB/s (%3.0f%% of direct)  cold get %5.0f MB/s (%3.0f%%)  hot get %5.0f MB/s",
				os.name, pw, 100*pw/w, pr, 100*pr/r, hot)
		}
	}
}

func mbps(bytes int64, d time.Duration) float64 { return float64(bytes) / 1e6 / d.Seconds() }

func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 4096 - int(uintptr(unsafe.Pointer(&b[0]))&4095)
	return b[off : off+n]
}

func rawDirect(t *testing.T, dir string, bs, n int) (float64, float64) {
	p := filepath.Join(dir, "raw.direct")
	defer os.Remove(p)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Skipf("O_DIRECT unsupported: %v", err)
	}
	buf := alignedBuf(bs)
	fillFor(testKey(0, 0), buf)
	start := time.Now()
	for i := range n {
		if _, err := f.WriteAt(buf, int64(i)*int64(bs)); err != nil {
			t.Fatal(err)
		}
	}
	f.Sync()
	w := mbps(int64(n)*int64(bs), time.Since(start))
	start = time.Now()
	for i := range n {
		if _, err := f.ReadAt(buf, int64(i)*int64(bs)); err != nil {
			t.Fatal(err)
		}
	}
	r := mbps(int64(n)*int64(bs), time.Since(start))
	f.Close()
	return w, r
}

func rawBuffered(t *testing.T, dir string, bs, n int) float64 {
	p := filepath.Join(dir, "raw.buffered")
	defer os.Remove(p)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, bs)
	fillFor(testKey(0, 0), buf)
	start := time.Now()
	for range n {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	f.Sync()
	w := mbps(int64(n)*int64(bs), time.Since(start))
	f.Close()
	return w
}

func dropCache(t *testing.T, dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
	}
}

// storeRun: 4 writers Put n blocks, then db.Sync (in the timing); close,
// drop the files' page cache, reopen, 4 readers Get every block (cold),
// then again (hot).
func storeRun(t *testing.T, base string, set optSet, bs, n int) (put, cold, hot float64) {
	dir := filepath.Join(base, "store")
	defer os.RemoveAll(dir)
	defer os.Remove(dir + ".lock")
	opts := Options{Dir: dir, CapacityBytes: 8 << 30, Logger: quietLogger(), SyncWrites: set.sync, tune: set.tune}
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	blocks := make([][]byte, 8)
	for i := range blocks {
		blocks[i] = payloadFor(testKey(2, uint64(i)), bs)
	}
	const workers = 4
	par := func(fn func(i int)) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += workers {
					fn(i)
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	total := int64(n) * int64(bs)
	start := time.Now()
	par(func(i int) {
		if err := s.Put(Key{NS: 2, Hash: testKey(2, uint64(i)).Hash}, blocks[i%8]); err != nil {
			t.Error(err)
		}
	})
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	put = mbps(total, time.Since(start))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	dropCache(t, dir)
	if s, err = Open(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bufs := make([][]byte, workers)
	var mu sync.Mutex
	get := func(i int) {
		mu.Lock()
		var b []byte
		if len(bufs) > 0 {
			b, bufs = bufs[len(bufs)-1], bufs[:len(bufs)-1]
		} else {
			b = make([]byte, bs)
		}
		mu.Unlock()
		if b == nil {
			b = make([]byte, bs)
		}
		if _, err := s.Get(Key{NS: 2, Hash: testKey(2, uint64(i)).Hash}, b); err != nil {
			t.Error(err)
		}
		mu.Lock()
		bufs = append(bufs, b)
		mu.Unlock()
	}
	for i := range bufs {
		bufs[i] = make([]byte, bs)
	}
	cold = mbps(total, par(get))
	hot = mbps(total, par(get))
	return put, cold, hot
}
