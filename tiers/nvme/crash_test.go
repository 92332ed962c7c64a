package nvme

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"
)

// verifyAll reads every indexed key and every key the writer could have
// written: each is byte-exact or a miss, never wrong.
func verifyAll(t *testing.T, s *Store, ns uint32, nkeys uint64, sizeOf func(Key) int) (hits, misses int) {
	t.Helper()
	dst := make([]byte, 16<<20)
	for i := range nkeys {
		k := testKey(ns, i)
		n, err := s.Get(k, dst)
		switch {
		case err == nil:
			if n != sizeOf(k) || !bytes.Equal(dst[:n], payloadFor(k, sizeOf(k))) {
				t.Fatalf("key %d: WRONG BYTES returned (n=%d want %d)", i, n, sizeOf(k))
			}
			hits++
		case errors.Is(err, ErrNotFound):
			misses++
		default:
			t.Fatalf("key %d: %v", i, err)
		}
	}
	return hits, misses
}

func TestCrashMidWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=crashwriter", "KVTIER_NVME_DIR="+dir,
			fmt.Sprintf("KVTIER_NVME_START=%d", round*1777))
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
		time.Sleep(time.Duration(300+rng.IntN(900)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()

		s := openT(t, dir, 256<<20)
		st := s.Stats()
		hits, misses := verifyAll(t, s, 7, 5000, func(k Key) int { return crashSize(k) })
		st2 := s.Stats()
		t.Logf("round %d: reindexed %d blocks in %v; hits %d misses %d checksum-misses %d moved-aside %q",
			round, st.ReindexBlocks, st.ReindexDuration, hits, misses, st2.ChecksumMisses, st.MovedAside)
		if hits == 0 {
			t.Fatalf("round %d: nothing survived the crash (stderr: %s)", round, stderr.String())
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTornValueLogTail simulates power loss: the unsynced tail of the head
// value-log file is cut off (and then garbage appended). Every key must
// still read back exact or as a miss.
func TestTornValueLogTail(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 256<<20)
	sizeOf := func(k Key) int { return 100<<10 + int(k.Hash.Lo%5)*1000 }
	const n = 400
	for i := range uint64(n) {
		k := testKey(9, i)
		if err := s.Put(k, payloadFor(k, sizeOf(k))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	vlogs, _ := filepath.Glob(filepath.Join(dir, segDirName, "*"+segSuffix))
	sort.Strings(vlogs)
	head := vlogs[len(vlogs)-1]
	fi, _ := os.Stat(head)
	cut := fi.Size() - 250<<10 - 12345
	if cut < 0 {
		cut = fi.Size() / 2
	}
	if err := os.Truncate(head, cut); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(head, os.O_WRONLY|os.O_APPEND, 0)
	junk := make([]byte, 7000)
	for i := range junk {
		junk[i] = byte(i * 31)
	}
	f.Write(junk)
	f.Close()

	s = openT(t, dir, 256<<20)
	defer s.Close()
	hits, misses := verifyAll(t, s, 9, n, sizeOf)
	t.Logf("torn tail: hits %d misses %d stats %+v", hits, misses, s.Stats())
	if hits == 0 {
		t.Fatal("nothing readable after a torn tail")
	}
	// The store keeps working.
	k := testKey(9, 1)
	if err := s.Put(k, payloadFor(k, sizeOf(k))); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, k, sizeOf(k))
}

func TestCorruptValueLog(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 256<<20)
	sizeOf := func(k Key) int { return 64 << 10 }
	const n = 600
	for i := range uint64(n) {
		k := testKey(5, i)
		if err := s.Put(k, payloadFor(k, sizeOf(k))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Flip bytes in the middle of the largest value-log file.
	vlogs, _ := filepath.Glob(filepath.Join(dir, segDirName, "*"+segSuffix))
	var largest string
	var lsz int64
	for _, v := range vlogs {
		if fi, _ := os.Stat(v); fi.Size() > lsz {
			largest, lsz = v, fi.Size()
		}
	}
	f, err := os.OpenFile(largest, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	for off := lsz / 4; off < lsz*3/4; off += 64 << 10 / 3 {
		f.ReadAt(buf, off)
		buf[0] ^= 0x5a
		f.WriteAt(buf, off)
	}
	f.Close()

	s = openT(t, dir, 256<<20)
	defer s.Close()
	failed := map[uint64]bool{}
	hits, misses := 0, 0
	{
		dst := make([]byte, 64<<10)
		for i := range uint64(n) {
			k := testKey(5, i)
			n, err := s.Get(k, dst)
			switch {
			case err == nil:
				if n != sizeOf(k) || !bytes.Equal(dst[:n], payloadFor(k, n)) {
					t.Fatalf("key %d: WRONG BYTES", i)
				}
				hits++
			case errors.Is(err, ErrChecksum):
				failed[i] = true
				misses++
			case errors.Is(err, ErrNotFound):
				misses++
			default:
				t.Fatalf("key %d: %v", i, err)
			}
		}
	}
	st := s.Stats()
	t.Logf("corrupt vlog: hits %d misses %d checksum misses %d", hits, misses, st.ChecksumMisses)
	if st.ChecksumMisses == 0 {
		t.Fatal("corruption not detected")
	}
	// Keys that failed verification were deleted: they are no longer in
	// the index and read as plain misses. (Other keys may fail now: value-log
	// GC of a damaged file stops at the first bad entry, so the entries after
	// it become unreadable — still misses, never wrong bytes.)
	dst := make([]byte, 64<<10)
	for i := range uint64(n) {
		k := testKey(5, i)
		if !failed[i] {
			continue
		}
		if s.Contains(k) {
			t.Fatalf("key %d failed verification but is still indexed", i)
		}
		if _, err := s.Get(k, dst); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrChecksum) {
			t.Fatalf("key %d: second read %v, want a plain miss", i, err)
		}
	}
	verifyAll(t, s, 5, n, sizeOf)
}

func TestCorruptManifestMovedAside(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	for i := range uint64(50) {
		k := testKey(1, i)
		if err := s.Put(k, payloadFor(k, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "MANIFEST"), []byte("garbage!"), 0o600); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		s = openT(t, dir, 64<<20)
		st := s.Stats()
		if st.MovedAside == "" || st.Blocks != 0 {
			t.Fatalf("round %d: expected move-aside and empty store, got %+v", round, st)
		}
		k := testKey(1, 1)
		if err := s.Put(k, payloadFor(k, 4096)); err != nil {
			t.Fatal(err)
		}
		mustGet(t, s, k, 4096)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// Corrupt again (truncate): only the newest corrupt dir is kept.
		if err := os.Truncate(filepath.Join(dir, "MANIFEST"), 3); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // distinct .corrupt-<unix> names
	}
	if m, _ := filepath.Glob(dir + ".corrupt-*"); len(m) != 1 {
		t.Fatalf("corrupt dirs kept: %v", m)
	}
}
