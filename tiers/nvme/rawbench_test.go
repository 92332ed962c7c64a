package nvme

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var (
	flagRawBench  = flag.Bool("nvme.rawbench", false, "compare the store's 2 MiB Put/Get with raw O_DIRECT I/O on the same filesystem (issue: tiering)")
	flagRawMiB    = flag.Int("nvme.rawbench.mib", 1024, "bytes per measurement for -nvme.rawbench, in MiB")
	flagRawRounds = flag.Int("nvme.rawbench.rounds", 4, "rounds for -nvme.rawbench (each round measures raw and store back to back)")
	flagRawProf   = flag.String("nvme.rawbench.cpuprofile", "", "write a CPU profile of the store's single-stream Put phase here")
	flagRawKiB    = flag.Int("nvme.rawbench.kib", 2048, "block size for -nvme.rawbench, in KiB")
	flagRawStr    = flag.String("nvme.rawbench.streams", "1,2", "comma-separated goroutine counts for -nvme.rawbench")
	flagRawBatch  = flag.Int("nvme.rawbench.batch", 1, "blocks per store call in -nvme.rawbench (PutBatch and GetBatch when > 1)")
)

// TestRawVsStore measures, in one run and on the filesystem of
// -nvme.benchdir, raw sequential O_DIRECT I/O of N×2 MiB and the store's Put
// and cold Get of N 2 MiB blocks, from 1 and 2 goroutines, and prints the
// ratios (-nvme.rawbench.kib and -nvme.rawbench.streams change the block
// size and the goroutine counts).
//
// Durability of the two sides is the same: the raw writer issues O_DIRECT
// pwrites and one fdatasync at the end; the store's Put phase ends with
// Store.Sync (fdatasync of the segment files and a sync of badger's WAL),
// which is included in the timing. Reads are cold on both sides: raw reads
// use O_DIRECT; the store is closed after the sync, its files' page cache
// dropped (posix_fadvise DONTNEED after the sync, so every page is clean
// and actually dropped), and reopened before the timed Gets (the reopen
// and reindex are not timed). Each Get verifies the XXH3-128 checksum.
//
//	go test ./tiers/nvme/ -run TestRawVsStore -nvme.rawbench -nvme.benchdir=/var/tmp -v
func TestRawVsStore(t *testing.T) {
	if !*flagRawBench {
		t.Skip("enable with -nvme.rawbench")
	}
	base := *flagBenchDir
	if base == "" {
		base = t.TempDir()
	} else {
		var err error
		if base, err = os.MkdirTemp(base, "nvmeraw"); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(base)
	}
	bs := *flagRawKiB << 10
	n := *flagRawMiB << 20 / bs
	var streamSet []int
	for _, f := range strings.Split(*flagRawStr, ",") {
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			t.Fatalf("-nvme.rawbench.streams: %q", f)
		}
		streamSet = append(streamSet, v)
	}
	type res struct{ rw, rr, sw, sr float64 }
	all := map[int][]res{}
	for round := range *flagRawRounds {
		for _, streams := range streamSet {
			prof := ""
			if round == 0 && streams == 1 {
				prof = *flagRawProf
			}
			// Alternate the order (raw first, then store first) so drift of
			// the device (the development VM's disk varies ±40% over
			// seconds) does not favour one side.
			var rw, rr, sw, sr float64
			if round%2 == 0 {
				rw, rr = rawStreams(t, base, bs, n, streams)
				sw, sr = storeStreams(t, base, bs, n, streams, prof)
			} else {
				sw, sr = storeStreams(t, base, bs, n, streams, prof)
				rw, rr = rawStreams(t, base, bs, n, streams)
			}
			all[streams] = append(all[streams], res{rw, rr, sw, sr})
			t.Logf("round %d, %d stream(s), %d×%d KiB: raw write %5.0f read %5.0f MB/s | store put+sync %5.0f (%3.0f%%) cold get %5.0f (%3.0f%%)",
				round, streams, n, bs>>10, rw, rr, sw, 100*sw/rw, sr, 100*sr/rr)
		}
	}
	med := func(xs []float64) float64 {
		sort.Float64s(xs)
		if len(xs)%2 == 1 {
			return xs[len(xs)/2]
		}
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	t.Logf("RAWBENCH summary (%d KiB blocks, %d MiB per measurement, %d rounds, medians over rounds; ratio = median of the per-round ratios):", bs>>10, n*bs>>20, *flagRawRounds)
	t.Logf("| streams | raw write MB/s | store put+sync MB/s | put/raw | raw read MB/s | store cold get MB/s | get/raw |")
	t.Logf("|---|---|---|---|---|---|---|")
	for _, streams := range streamSet {
		var rw, rr, sw, sr, pw, pr []float64
		for _, r := range all[streams] {
			rw, rr, sw, sr = append(rw, r.rw), append(rr, r.rr), append(sw, r.sw), append(sr, r.sr)
			pw, pr = append(pw, r.sw/r.rw), append(pr, r.sr/r.rr)
		}
		mpw, mpr := med(pw), med(pr)
		t.Logf("| %d | %.0f | %.0f | %.0f%% (%.0f–%.0f%%) | %.0f | %.0f | %.0f%% (%.0f–%.0f%%) |", streams,
			med(rw), med(sw), 100*mpw, 100*pw[0], 100*pw[len(pw)-1], med(rr), med(sr), 100*mpr, 100*pr[0], 100*pr[len(pr)-1])
	}
}

// rawStreams writes n blocks of bs with O_DIRECT from streams goroutines,
// each sequentially into its own file, fdatasyncs them (timed), then reads
// them back with O_DIRECT (timed).
func rawStreams(t *testing.T, dir string, bs, n, streams int) (w, r float64) {
	files := make([]*os.File, streams)
	for i := range files {
		p := filepath.Join(dir, fmt.Sprintf("raw.%d", i))
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_DIRECT, 0o600)
		if err != nil {
			t.Skipf("O_DIRECT unsupported: %v", err)
		}
		defer os.Remove(p)
		defer f.Close()
		files[i] = f
	}
	run := func(write bool) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for s := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := alignedBuf(bs)
				fillFor(testKey(0, uint64(s)), buf)
				f := files[s]
				for i, j := s, 0; i < n; i, j = i+streams, j+1 {
					var err error
					if write {
						_, err = f.WriteAt(buf, int64(j)*int64(bs))
					} else {
						_, err = f.ReadAt(buf, int64(j)*int64(bs))
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
				if write {
					if err := unix.Fdatasync(int(f.Fd())); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	total := int64(n) * int64(bs)
	w = mbps(total, run(true))
	r = mbps(total, run(false))
	return w, r
}

// storeStreams: streams goroutines Put n blocks (distinct payloads), then
// Sync (timed); close, drop the page cache, reopen, streams goroutines Get
// every block (timed, cold).
func storeStreams(t *testing.T, base string, bs, n, streams int, cpuprof string) (w, r float64) {
	dir := filepath.Join(base, "store")
	defer os.RemoveAll(dir)
	defer os.Remove(dir + ".lock")
	opts := Options{Dir: dir, CapacityBytes: 4 * int64(n) * int64(bs), Logger: quietLogger()}
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	blocks := make([][]byte, 16)
	for i := range blocks {
		blocks[i] = payloadFor(testKey(2, uint64(i)), bs)
	}
	par := func(fn func(i int, buf []byte)) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for g := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, bs)
				for i := g; i < n; i += streams {
					fn(i, buf)
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	key := func(i int) Key { return Key{NS: 2, Hash: testKey(3, uint64(i)).Hash} }
	total := int64(n) * int64(bs)
	if cpuprof != "" {
		f, err := os.Create(cpuprof)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
	}
	start := time.Now()
	if b := *flagRawBatch; b > 1 {
		// Each goroutine stores runs of b consecutive blocks with one call.
		inRuns(n, b, streams, func(_, lo, hi int) {
			var ks []Key
			var bs [][]byte
			for i := lo; i < hi; i++ {
				ks, bs = append(ks, key(i)), append(bs, blocks[i%len(blocks)])
			}
			if err := s.PutBatch(ks, bs); err != nil {
				t.Error(err)
			}
		})
	} else {
		par(func(i int, _ []byte) {
			if err := s.Put(key(i), blocks[i%len(blocks)]); err != nil {
				t.Error(err)
			}
		})
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	w = mbps(total, time.Since(start))
	if cpuprof != "" {
		pprof.StopCPUProfile()
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	dropCache(t, dir)
	if s, err = Open(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if b := *flagRawBatch; b > 1 {
		// Each goroutine reads runs of b consecutive blocks with one call.
		bufs := make([][][]byte, streams)
		for g := range bufs {
			for range b {
				bufs[g] = append(bufs[g], alignedBuf(bs))
			}
		}
		return w, mbps(total, inRuns(n, b, streams, func(g, lo, hi int) {
			var ks []Key
			for i := lo; i < hi; i++ {
				ks = append(ks, key(i))
			}
			ns, errs := s.GetBatch(ks, bufs[g][:len(ks)])
			for i := range ks {
				if errs[i] != nil || ns[i] != bs {
					t.Errorf("GetBatch %d: n=%d err=%v", lo+i, ns[i], errs[i])
				}
			}
		}))
	}
	r = mbps(total, par(func(i int, buf []byte) {
		if n, err := s.Get(key(i), buf); err != nil || n != bs {
			t.Errorf("Get %d: n=%d err=%v", i, n, err)
		}
	}))
	return w, r
}

// inRuns calls fn for each run [lo, hi) of b consecutive indexes below n,
// the runs dealt round-robin to streams goroutines (g is the goroutine's
// number), and returns how long they all took.
func inRuns(n, b, streams int, fn func(g, lo, hi int)) time.Duration {
	start := time.Now()
	runs := (n + b - 1) / b
	var wg sync.WaitGroup
	for g := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := g; j < runs; j += streams {
				fn(g, j*b, min(n, (j+1)*b))
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}
