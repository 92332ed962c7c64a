package nvme

// The byte budget under concurrent and unevictable Puts; relocation under
// stress; kill -9 images of a busy store (SIGSTOP, copy, SIGCONT).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestUnevictableFillsBudget: Options.Unevictable says "When they
// fill the budget, Put fails with ErrNoSpace instead"; putChunk picks no
// victim among them and stores the block anyway, over the logical limit.
func TestUnevictableFillsBudget(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: 64 << 20, Logger: quietLogger(),
		Unevictable: func(k Key) bool { return k.NS == 9 }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const blk = 256 << 10
	over := 0
	for i := range uint64(200) {
		k := testKey(9, i)
		err := s.Put(k, payloadFor(k, blk))
		if errors.Is(err, ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if st := s.Stats(); st.Bytes+int64(st.Blocks)*blockOverhead > st.LogicalLimit {
			over++
		}
	}
	if st := s.Stats(); over > 0 {
		t.Fatalf("%d parked Puts returned nil over the logical limit: %d parked bytes, limit %d, disk %d of %d",
			over, st.Bytes+int64(st.Blocks)*blockOverhead, st.LogicalLimit, storeUsage(dir), st.Capacity)
	}
}

// TestWaitRoomConcurrentPuts: waitRoom checks the estimated disk
// usage plus the caller's own bytes, but the bytes of Puts admitted
// earlier and still writing are only added to writtenSince after their
// commit: concurrent Puts are all admitted against the same estimate and
// together take the directory past the capacity.
func TestWaitRoomConcurrentPuts(t *testing.T) {
	const capacity = 64 << 20
	const blk = 4 << 20
	const writers = 4
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, capacity)
	defer s.Close()
	headroom := min(s.segFileSize/4, int64(capacity/32))
	// A file in the store directory counts in the measured usage: fill it
	// so that exactly one more block fits under the capacity.
	used := storeUsage(dir)
	fill := capacity - headroom - s.charge(blk) - used - 64<<10
	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, fill), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("before %d, measured %d, disk now %d", used, s.measure(), storeUsage(dir))
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, writers)
	var mu sync.Mutex
	var peak int64
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := testKey(1, uint64(w))
			b := payloadFor(k, blk)
			<-start
			errs[w] = s.Put(k, b)
			if errs[w] == nil {
				mu.Lock()
				peak = max(peak, storeUsage(dir))
				mu.Unlock()
			}
		}()
	}
	// As a DeleteNS would: hold the write gate while the Puts pass
	// waitRoom, so that all of them are admitted before any writes.
	s.gate.Lock()
	close(start)
	time.Sleep(300 * time.Millisecond)
	s.gate.Unlock()
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
		}
	}
	if d := peak; d > capacity {
		t.Fatalf("%d of %d concurrent %d MiB Puts admitted with room for one: directory %d bytes > capacity %d", ok, writers, blk>>20, d, capacity)
	}
}

// genPayload: first 8 bytes gen, rest derived from (key, gen).
func genPayload(k Key, gen uint64, size int) []byte {
	b := alignedBuf(size)
	fillFor(Key{NS: k.NS ^ uint32(gen), Hash: k.Hash}, b)
	if size >= 8 {
		binary.LittleEndian.PutUint64(b, gen)
	}
	return b
}

func checkGenPayload(k Key, b []byte) (uint64, bool) {
	if len(b) < 8 {
		return 0, true
	}
	gen := binary.LittleEndian.Uint64(b)
	want := genPayload(k, gen, len(b))
	return gen, string(want) == string(b)
}

// TestRelocationStress: relocation (forced compaction of every
// non-active segment) and eviction race Put/PutBatch/Delete/DeleteNS/
// GetBatch of the same keys; afterwards the invariants must hold.
func TestRelocationStress(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	defer s.Close()
	old := runtime.GOMAXPROCS(8)
	defer runtime.GOMAXPROCS(old)
	s.segs.fileSize = 1 << 20 // rotate often: many collectable segments
	s.bud.Store(&budget{capacity: 64 << 20, baseLimit: 200 << 10, softCap: 64<<20 - 8<<20})
	const nkeys = 400
	var gen atomic.Uint64
	deadline := time.Now().Add(4 * time.Second)
	var wrong atomic.Int64
	for round := 0; time.Now().Before(deadline); round++ {
		var stop atomic.Bool
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; !stop.Load(); j++ {
					i := uint64((j*7 + w*13) % nkeys)
					k := testKey(uint32(1+i%2), i)
					switch j % 11 {
					case 0:
						_ = s.Delete(k)
					case 1:
						ks := []Key{k, testKey(uint32(1+(i+1)%2), (i+1)%nkeys)}
						bs := [][]byte{genPayload(ks[0], gen.Add(1), 4096*(1+j%3)), genPayload(ks[1], gen.Add(1), 5000)}
						_ = s.PutBatch(ks, bs)
					default:
						_ = s.Put(k, genPayload(k, gen.Add(1), 64<<10*(1+j%4)+j%3))
					}
				}
			}()
		}
		wg.Add(1)
		go func() { // reader
			defer wg.Done()
			for !stop.Load() {
				keys := make([]Key, 8)
				dsts := make([][]byte, 8)
				for i := range keys {
					keys[i] = testKey(uint32(1+i%2), uint64(i*5)%nkeys)
					dsts[i] = alignedBuf(300 << 10)
				}
				ns, errs := s.GetBatch(keys, dsts)
				for i := range keys {
					if errs[i] == nil {
						if _, ok := checkGenPayload(keys[i], dsts[i][:ns[i]]); !ok {
							wrong.Add(1)
						}
					}
				}
			}
		}()
		wg.Add(1)
		go func() { // compaction of everything
			defer wg.Done()
			ctx := context.Background()
			for !stop.Load() {
				s.runGC(ctx, 0)
				runtime.Gosched()
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				time.Sleep(120 * time.Millisecond)
				_, _ = s.DeleteNS(2)
			}
		}()
		time.Sleep(300 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		if bad := checkInvariants(s); len(bad) > 0 {
			t.Fatalf("round %d: invariants broken:\n%v\nstats %+v", round, bad, s.Stats())
		}
	}
	if wrong.Load() > 0 {
		t.Fatalf("%d wrong reads", wrong.Load())
	}
	t.Logf("stats %+v", s.Stats())
}

// ---- crash snapshots: a child process writes; the parent SIGSTOPs it,
// copies the store directory (a kill -9 image), SIGCONTs it. Each copy is
// then opened and every key checked against the child's op log.

const crashChildEnv = "KVTIER_TEST_CRASH_CHILD"

func TestCrashSnapshotChild(t *testing.T) {
	mode := os.Getenv(crashChildEnv)
	if mode == "" {
		t.Skip("helper")
	}
	dir := os.Getenv("KVTIER_TEST_CRASH_DIR")
	logf, err := os.OpenFile(os.Getenv("KVTIER_TEST_CRASH_LOG"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Println("log:", err)
		os.Exit(1)
	}
	capacity := int64(256 << 20)
	if mode == "evict" {
		capacity = 64 << 20
	}
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: capacity, Logger: quietLogger(), GCInterval: 5 * time.Millisecond})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	s.segs.fileSize = 1 << 20
	if mode == "evict" {
		s.bud.Store(&budget{capacity: 64 << 20, baseLimit: 4 << 20, softCap: 56 << 20})
	}
	logLine := func(f string, a ...any) { logf.Write([]byte(fmt.Sprintf(f, a...))) }
	fmt.Println("ready")
	var gen atomic.Uint64
	const nkeys = 300
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				i := uint64(w + 4*((j*7)%(nkeys/4)))
				ns := uint32(1 + j%2)
				k := testKey(ns, i)
				switch {
				case j%9 == 0:
					logLine("S X %d %d\n", ns, i)
					if err := s.Delete(k); err == nil {
						logLine("D X %d %d\n", ns, i)
					}
				case j%4 == 0:
					k2 := testKey(ns, (i+4)%nkeys)
					g1, g2 := gen.Add(1), gen.Add(1)
					logLine("S P %d %d %d\n", ns, k.Hash.Lo, g1)
					logLine("S P %d %d %d\n", ns, k2.Hash.Lo, g2)
					if err := s.PutBatch([]Key{k, k2}, [][]byte{genPayload(k, g1, 16<<10+j%5000), genPayload(k2, g2, 40<<10)}); err == nil {
						logLine("D P %d %d %d\n", ns, k.Hash.Lo, g1)
						logLine("D P %d %d %d\n", ns, k2.Hash.Lo, g2)
					}
				default:
					g := gen.Add(1)
					logLine("S P %d %d %d\n", ns, i, g)
					if err := s.Put(k, genPayload(k, g, 8<<10*(1+j%12)+j%3)); err == nil {
						logLine("D P %d %d %d\n", ns, i, g)
					}
				}
			}
		}()
	}
	go func() {
		for {
			time.Sleep(100 * time.Millisecond)
			st := s.Stats()
			fmt.Fprintf(os.Stderr, "relocated %d gcruns %d evictions %d puts %d\n", st.Relocated, st.GCRuns, st.Evictions, st.Puts)
		}
	}()
	go func() {
		for {
			time.Sleep(37 * time.Millisecond)
			logLine("S N 2\n")
			if _, err := s.DeleteNS(2); err == nil {
				logLine("D N 2\n")
			}
		}
	}()
	go func() {
		dsts := make([][]byte, 6)
		for i := range dsts {
			dsts[i] = alignedBuf(128 << 10)
		}
		for j := 0; ; j++ {
			keys := make([]Key, 6)
			for i := range keys {
				keys[i] = testKey(uint32(1+i%2), uint64((j+i*3)%nkeys))
			}
			s.GetBatch(keys, dsts)
		}
	}()
	wg.Wait()
}

type auditEv struct {
	start, done int // log positions (line numbers); done -1 if not completed
	put         bool
	gen         uint64
}

func stoppedAll(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false
	}
	for _, tk := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, tk.Name()))
		if err != nil {
			return false
		}
		st := string(b)
		p := strings.LastIndexByte(st, ')')
		if p < 0 || p+2 >= len(st) || (st[p+2] != 'T' && st[p+2] != 't') {
			return false
		}
	}
	return true
}

func runCrashSnapshots(t *testing.T, mode string) {
	base := t.TempDir()
	dir := filepath.Join(base, "nvme")
	logPath := filepath.Join(base, "ops.log")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashSnapshotChild$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+mode, "KVTIER_TEST_CRASH_DIR="+dir, "KVTIER_TEST_CRASH_LOG="+logPath)
	out, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q %s", line, stderr.String())
	}
	type snap struct {
		dir    string
		logLen int64
	}
	var snaps []snap
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	for n := range 8 {
		time.Sleep(time.Duration(80+rng.IntN(250)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGSTOP)
		for !stoppedAll(cmd.Process.Pid) {
			time.Sleep(time.Millisecond)
		}
		fi, err := os.Stat(logPath)
		if err != nil {
			t.Fatal(err)
		}
		sd := filepath.Join(base, fmt.Sprintf("snap%d", n))
		if o, err := exec.Command("cp", "-a", dir, sd).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, o)
		}
		snaps = append(snaps, snap{sd, fi.Size()})
		cmd.Process.Signal(syscall.SIGCONT)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if ls := strings.Split(strings.TrimSpace(stderr.String()), "\n"); len(ls) > 0 {
		t.Logf("child: %s", ls[len(ls)-1])
	}
	logAll, _ := os.ReadFile(logPath)
	for n, sn := range snaps {
		lines := strings.Split(string(logAll[:sn.logLen]), "\n")
		evs := map[Key][]*auditEv{}
		type nsEv struct{ start, done int }
		var nsDel []*nsEv
		open := map[string]*auditEv{}
		var openNS *nsEv
		for ln, l := range lines {
			f := strings.Fields(l)
			if len(f) < 3 {
				continue
			}
			switch f[1] {
			case "N":
				if f[0] == "S" {
					openNS = &nsEv{ln, -1}
					nsDel = append(nsDel, openNS)
				} else {
					openNS.done = ln
				}
				continue
			}
			ns, _ := strconv.ParseUint(f[2], 10, 32)
			i, _ := strconv.ParseUint(f[3], 10, 64)
			k := testKey(uint32(ns), i)
			var g uint64
			if f[1] == "P" {
				g, _ = strconv.ParseUint(f[4], 10, 64)
			}
			id := fmt.Sprint(f[1], k, g)
			if f[0] == "S" {
				e := &auditEv{start: ln, done: -1, put: f[1] == "P", gen: g}
				evs[k] = append(evs[k], e)
				open[id] = e
			} else {
				open[id].done = ln
			}
		}
		s, err := Open(context.Background(), Options{Dir: sn.dir, CapacityBytes: 256 << 20, Logger: quietLogger()})
		if err != nil {
			t.Fatalf("snap %d: open: %v", n, err)
		}
		dst := alignedBuf(256 << 10)
		var hits, misses, mustMiss int
		var lost []string
		for ns := uint32(1); ns <= 2; ns++ {
			for i := range uint64(300) {
				k := testKey(ns, i)
				// destroy events of k: its deletes and DeleteNS of ns 2.
				type iv struct{ start, done int }
				var destroys []iv
				var puts []*auditEv
				for _, e := range evs[k] {
					if e.put {
						puts = append(puts, e)
					} else {
						destroys = append(destroys, iv{e.start, e.done})
					}
				}
				if ns == 2 {
					for _, d := range nsDel {
						destroys = append(destroys, iv{d.start, d.done})
					}
				}
				before := func(aDone, bStart int) bool { return aDone >= 0 && aDone < bStart }
				visible := func(p *auditEv) bool {
					for _, d := range destroys {
						if d.done >= 0 && before(p.done, d.start) {
							return false
						}
					}
					for _, q := range puts {
						if q != p && q.done >= 0 && before(p.done, q.start) {
							return false
						}
					}
					return true
				}
				// must hit: the last put completed, nothing after it could destroy it
				mustHit := false
				if len(puts) > 0 {
					last := puts[len(puts)-1]
					if last.done >= 0 {
						mustHit = true
						for _, d := range destroys {
							if !before(d.done, last.start) {
								mustHit = false
							}
						}
						for _, q := range puts[:len(puts)-1] {
							if q.done < 0 {
								mustHit = false
							}
						}
					}
				}
				nb, err := s.Get(k, dst)
				switch {
				case err == nil:
					hits++
					g, ok := checkGenPayload(k, dst[:nb])
					if !ok {
						t.Errorf("snap %d: %v: WRONG BYTES (%d bytes)", n, k, nb)
						continue
					}
					var p *auditEv
					for _, q := range puts {
						if q.gen == g {
							p = q
						}
					}
					if p == nil {
						t.Errorf("snap %d: %v: gen %d never put (before the snapshot)", n, k, g)
					} else if !visible(p) {
						t.Errorf("snap %d: %v: gen %d RESURRECTED (overwritten or deleted before the snapshot)", n, k, g)
					}
				case errors.Is(err, ErrNotFound):
					misses++
					if mustHit && mode != "evict" {
						lost = append(lost, fmt.Sprintf("%v gen %d", k, puts[len(puts)-1].gen))
					}
				default:
					t.Errorf("snap %d: %v: %v", n, k, err)
				}
				_ = mustMiss
			}
		}
		st := s.Stats()
		if bad := checkInvariants(s); len(bad) > 0 {
			t.Errorf("snap %d: invariants after reopen: %v", n, bad)
		}
		s.Close()
		t.Logf("snap %d: log %d lines, reindexed %d, hits %d misses %d checksum misses %d, lost %d", n, len(lines), st.ReindexBlocks, hits, misses, st.ChecksumMisses, len(lost))
		if len(lost) > 0 {
			t.Errorf("snap %d: completed puts lost: %v", n, lost)
		}
	}
}

func TestCrashSnapshots(t *testing.T)      { runCrashSnapshots(t, "keep") }
func TestCrashSnapshotsEvict(t *testing.T) { runCrashSnapshots(t, "evict") }
