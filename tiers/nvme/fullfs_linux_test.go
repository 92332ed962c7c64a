package nvme

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// mountSmallTmpfs mounts a tmpfs of size bytes on dir for the rest of the
// test (skipped when that is not possible).
func mountSmallTmpfs(t *testing.T, dir string, size int64) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs (to fill the filesystem for real) needs root")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.FormatInt(size, 10)+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// fillFilesystem writes a file at path that leaves about free bytes
// available on its filesystem.
func fillFilesystem(t *testing.T, path string, free int64) {
	t.Helper()
	a, ok := fsAvail(filepath.Dir(path))
	if !ok {
		t.Fatal("statfs failed")
	}
	if a <= free {
		return
	}
	if err := os.WriteFile(path, make([]byte, a-free), 0o600); err != nil {
		t.Fatal(err)
	}
	if a, _ = fsAvail(filepath.Dir(path)); a > 2*free {
		t.Fatalf("filesystem still has %d bytes free", a)
	}
}

// TestReopenOnFullFilesystem: a filled store is reopened while something
// else has filled its filesystem to the last 64 KiB, in two ways that make
// Open delete many index records: under a smaller capacity (it evicts down
// to the new budget), and with its segment files lost (reindex drops the
// records that point into them). Each deletion is a badger tombstone,
// which badger appends to its write-ahead log through a shared mapping of
// a sparse file: past the filesystem's free space that is SIGBUS, not an
// error. The reopen runs in a child process; it must neither crash nor
// serve wrong bytes.
func TestReopenOnFullFilesystem(t *testing.T) {
	for _, tc := range []struct {
		name       string
		capacity   int64 // of the reopen
		loseSegs   bool  // remove the segment files before it
		wantBlocks bool  // some blocks must survive
	}{
		{"smaller capacity", MinCapacity, false, true},
		{"segments lost", 100 << 20, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, held := fullStore(t)
			if tc.loseSegs {
				segs, err := filepath.Glob(filepath.Join(dir, segDirName, "*"+segSuffix))
				if err != nil || len(segs) == 0 {
					t.Fatalf("segments: %v %v", segs, err)
				}
				for _, p := range segs {
					if err := os.Remove(p); err != nil {
						t.Fatal(err)
					}
				}
			}
			fillFilesystem(t, filepath.Join(filepath.Dir(dir), "filler"), 64<<10)

			out := runFullFSChild(t, "reopensmaller", dir, held, "KVTIER_NVME_CAPACITY="+strconv.FormatInt(tc.capacity, 10))
			if tc.wantBlocks && strings.Contains(out, " hits=0 ") {
				t.Fatalf("nothing survived the reopen: %s", out)
			}
			t.Logf("held %d blocks; reopen: %s", held, out)
		})
	}
}

// fullStore fills a store on a 160 MiB tmpfs with reopenKeys blocks of
// reopenBlock bytes (budget 100 MiB, so some are evicted), closes it and
// returns its directory and how many blocks it held.
func fullStore(t *testing.T) (string, int) {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "fs")
	mountSmallTmpfs(t, mnt, 160<<20)
	dir := filepath.Join(mnt, "nvme")
	s := openT(t, dir, 100<<20)
	var ks []Key
	var bs [][]byte
	for i := range uint64(reopenKeys) {
		k := testKey(9, i)
		ks, bs = append(ks, k), append(bs, payloadFor(k, reopenBlock))
		if len(ks) == 64 || i == reopenKeys-1 {
			if err := s.PutBatch(ks, bs); err != nil {
				t.Fatalf("put batch at %d: %v", i, err)
			}
			ks, bs = ks[:0], bs[:0]
		}
	}
	held := s.Stats().Blocks
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, held
}

// runFullFSChild runs helper mode on the store in dir in a child process
// (a SIGBUS there fails the test instead of killing it) and returns its
// "ok ..." line.
func runFullFSChild(t *testing.T, mode, dir string, held int, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "KVTIER_NVME_DIR="+dir)
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil || !strings.HasPrefix(stdout.String(), "ok ") {
		msg := stderr.String()
		if i := strings.Index(msg, "\ngoroutine "); i > 0 {
			msg = msg[:i] // the crash's first lines say what it was
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s on a full filesystem (store of %d blocks): child exited with %v:\n%s", mode, held, ee, msg)
		}
		t.Fatalf("%s child: %v (stdout %q):\n%s", mode, err, stdout.String(), msg)
	}
	return strings.TrimSpace(stdout.String())
}

// TestIndexWritesOnFullFilesystem: with the store's filesystem filled by
// something else to the last 64 KiB, operations that write index records
// without a Put (and its room check) before them run in a child process:
// every block deleted one by one ("delete") and as a namespace
// ("deletens"); every block read after all were damaged, so that each Get
// deletes a record ("getcorrupt"); maintenance passes over a store whose
// every other block was deleted (with room), so that compaction rewrites
// the records of the blocks it moves ("compact"). Badger writes its log
// through a shared mapping of a sparse file: past the free space that is
// SIGBUS. A Delete the filesystem has no room to log takes the block out
// of the index at once and logs its tombstone once there is room; every
// block must read back exact or be a miss, deleted ones a miss, also after
// room came back and the store was reopened.
func TestIndexWritesOnFullFilesystem(t *testing.T) {
	for _, op := range []string{"delete", "deletens", "getcorrupt", "compact"} {
		t.Run(op, func(t *testing.T) {
			dir, held := fullStore(t)
			switch op {
			case "getcorrupt":
				corruptSegments(t, dir)
			case "compact":
				held = halveStore(t, dir)
			}
			filler := filepath.Join(filepath.Dir(dir), "filler")
			fillFilesystem(t, filler, 64<<10)
			out := runFullFSChild(t, "deleteall", dir, held, "KVTIER_NVME_OP="+op, "KVTIER_NVME_FILLER="+filler)
			t.Logf("held %d blocks; %s", held, out)
		})
	}
}

// corruptSegments flips a byte in every 4 KiB of every segment of the
// store in dir.
func corruptSegments(t *testing.T, dir string) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, segDirName, "*"+segSuffix))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments: %v %v", segs, err)
	}
	for _, p := range segs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i := 100; i < len(b); i += 4096 {
			b[i] ^= 0x5a
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// halveStore deletes every other block of the store in dir (while its
// filesystem has room) and returns how many blocks it holds then.
func halveStore(t *testing.T, dir string) int {
	t.Helper()
	s, err := Open(t.Context(), Options{Dir: dir, CapacityBytes: 100 << 20, Logger: quietLogger(), GCInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < reopenKeys; i += 2 {
		if err := s.Delete(testKey(9, i)); err != nil {
			t.Fatal(err)
		}
	}
	held := s.Stats().Blocks
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return held
}

// TestReopenAfterKillOnFullFilesystem: a store killed before it closed
// leaves its last index records in badger's write-ahead log, which the
// next Open replays and writes out as a table through a shared mapping of
// a new file. With the filesystem filled by something else meanwhile,
// that write was SIGBUS inside badger's Open, at every restart. Open must
// refuse (ErrNoSpace: the daemon runs with the host tier only) and leave
// the directory as it is, and open it whole once there is room.
func TestReopenAfterKillOnFullFilesystem(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "fs")
	mountSmallTmpfs(t, mnt, 160<<20)
	dir := filepath.Join(mnt, "nvme")
	runFullFSChild(t, "putnoclose", dir, 0)
	filler := filepath.Join(mnt, "filler")
	fillFilesystem(t, filler, 64<<10)
	if out := runFullFSChild(t, "openstat", dir, 0); out != "ok refused" {
		t.Fatalf("open on a full filesystem: %s, want it refused for want of space", out)
	}
	if aside, _ := filepath.Glob(dir + ".corrupt-*"); len(aside) > 0 {
		t.Fatalf("the store was moved aside: %v", aside)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if out, want := runFullFSChild(t, "openstat", dir, 0), fmt.Sprintf("ok blocks=%d", replayKeys); out != want {
		t.Fatalf("open with room: %s, want %s", out, want)
	}
}

// TestCloseWritesEveryLateDelete: a namespace deleted while the filesystem
// had no room to log its tombstones leaves the index at once; Close, with
// room again, must write every one of them, not one round's worth
// (maxVictimsPerPut): the blocks past it came back at the next Open.
func TestCloseWritesEveryLateDelete(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "fs")
	mountSmallTmpfs(t, mnt, 160<<20)
	dir := filepath.Join(mnt, "nvme")
	open := func() *Store {
		s, err := Open(t.Context(), Options{Dir: dir, CapacityBytes: 100 << 20, Logger: quietLogger(), GCInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	const n = maxVictimsPerPut + 100
	var ks []Key
	var bs [][]byte
	for i := range uint64(n) {
		// A block of namespace 2 beside every 64 of namespace 1 keeps
		// the segments alive, so the records left behind stay valid.
		for _, k := range []Key{testKey(1, i), testKey(2, i)} {
			if k.NS == 2 && i%64 != 0 {
				continue
			}
			ks, bs = append(ks, k), append(bs, payloadFor(k, 64))
		}
		if len(ks) >= 64 || i == n-1 {
			if err := s.PutBatch(ks, bs); err != nil {
				t.Fatalf("put batch at %d: %v", i, err)
			}
			ks, bs = ks[:0], bs[:0]
		}
	}
	filler := filepath.Join(mnt, "filler")
	fillFilesystem(t, filler, 16<<10)
	if room := s.deletionRoom(); room != 0 {
		t.Fatalf("deletionRoom %d on a full filesystem, want 0", room)
	}
	if got, err := s.DeleteNS(1); got != n || err != nil {
		t.Fatalf("DeleteNS = %d, %v; want %d, nil", got, err, n)
	}
	waitPasses(s, 2) // the passes it woke ran while the filesystem was full
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	defer s.Close()
	back := 0
	s.Keys(func(k Key, _ int64) bool {
		if k.NS == 1 {
			back++
		}
		return true
	})
	if back != 0 {
		t.Fatalf("%d blocks of the deleted namespace back after reopen, want 0", back)
	}
}
