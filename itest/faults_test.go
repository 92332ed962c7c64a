package itest

// Faults the tier chain must survive (issue 3): a full disk under the NVMe
// tier, corrupted value bytes on disk, a daemon killed with SIGKILL while
// it demotes. Each runs the daemon as a child process, so a daemon crash
// fails the test with the daemon's stderr instead of killing the test
// binary. (A slow disk not stalling Lookup is tested in tiers, where the
// mover's I/O hook can slow the NVMe tier: TestChainSlowDiskLookup.)

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
)

// mountTmpfs mounts a tmpfs of size bytes on dir for the rest of the test.
// It skips the test when that is not possible (not root, no mount
// namespace privileges).
func mountTmpfs(t *testing.T, dir string, size int64) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs (to fill the disk for real) needs root")
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

func moveStats(st *client.Stats, from, to string) (m struct{ Blocks, Errors uint64 }) {
	for _, x := range st.Moves {
		if x.From == from && x.To == to {
			m.Blocks, m.Errors = x.Blocks, x.Errors
		}
	}
	return m
}

func tierStats(st *client.Stats, name string) (ts struct {
	Blocks         int
	DiskBytes      int64
	ChecksumMisses uint64
}) {
	for _, x := range st.Tiers {
		if x.Name == name {
			ts.Blocks, ts.DiskBytes, ts.ChecksumMisses = x.Blocks, x.DiskBytes, x.ChecksumMisses
		}
	}
	return ts
}

// verifyAll gets every block of hs: each must be byte-exact or a miss. It
// returns the number of hits.
func verifyAll(t *testing.T, s *client.Session, hs []client.Hash) int {
	t.Helper()
	bs := s.BlockBytes()
	dst := make([]byte, bs)
	hits := 0
	for i, h := range hs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		clear(dst)
		err := s.Get(ctx, h, dst)
		cancel()
		switch {
		case err == nil:
			if !bytes.Equal(dst, payload(h, bs)) {
				t.Fatalf("block %d (%s): wrong bytes served", i, h)
			}
			hits++
		case errors.Is(err, client.ErrNotFound):
		default:
			t.Fatalf("get %d: %v", i, err)
		}
	}
	return hits
}

// alive fails the test if the daemon process has exited.
func alive(t *testing.T, d *proc) {
	t.Helper()
	select {
	case <-d.done:
		t.Fatalf("kvtierd exited (%v); stderr tail:\n%s", d.err, tail(d.stderr.String(), 4000))
	default:
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// stopDaemon sends SIGTERM (the daemon writes its host tier down) and
// requires a clean exit.
func stopDaemon(t *testing.T, d *proc, within time.Duration) {
	t.Helper()
	if err := d.signal(syscall.SIGTERM, within); err != nil {
		t.Fatalf("kvtierd exit after SIGTERM: %v; stderr tail:\n%s", err, tail(d.stderr.String(), 4000))
	}
}

// pacedPut puts hs one by one and after each waits until the host tier is
// back under its high watermark, like a workload whose think time lets the
// mover keep up; the wait ends early when demotion is failing (an error
// was counted, or nothing moved for 50 ms), and after max. Recent blocks
// must read back byte-exact all along. If stop is set, pacedPut returns
// after the first put at which stop holds. It returns how many blocks it
// put.
func pacedPut(t *testing.T, d *proc, c *client.Client, s *client.Session, hs []client.Hash, max time.Duration, stop func(*client.Stats) bool) int {
	t.Helper()
	ctx := context.Background()
	bs := s.BlockBytes()
	got := make([]byte, bs)
	for i, h := range hs {
		before := moveStats(stats(t, c), "host", "nvme")
		if _, err := s.Put(ctx, h, payload(h, bs)); err != nil {
			alive(t, d)
			t.Fatalf("put %d: %v", i, err)
		}
		last, since := before.Blocks, time.Now()
		st, _, _ := waitStats(t, c, max, func(st *client.Stats) bool {
			used, capacity := hostUsed(st)
			m := moveStats(st, "host", "nvme")
			if m.Blocks != last {
				last, since = m.Blocks, time.Now()
			}
			return float64(used) <= 0.95*float64(capacity) || m.Errors > before.Errors || time.Since(since) > 50*time.Millisecond
		})
		if i >= 4 {
			if err := s.Get(ctx, hs[i-4], got); err != nil {
				alive(t, d)
				t.Fatalf("get of block %d, put 4 puts ago: %v", i-4, err)
			}
			if !bytes.Equal(got, payload(hs[i-4], bs)) {
				t.Fatalf("recent block %d: wrong bytes", i-4)
			}
		}
		if stop != nil && stop(st) {
			return i + 1
		}
	}
	return len(hs)
}

// TestFaultNVMeDiskFull puts the NVMe tier's directory on a 96 MiB tmpfs
// while its budget says 1 GiB, so the filesystem fills long before the
// budget does, then writes far more than host + disk hold. The host tier
// keeps serving byte-exact, failed demotions are counted, the daemon
// neither crashes nor wedges, and once the blocks are deleted demotion
// works again. The daemon runs as a child process so that a crash (badger
// writes through mmap: a full filesystem can mean SIGBUS) fails the test
// instead of killing it.
func TestFaultNVMeDiskFull(t *testing.T) {
	const bs = 1 << 20
	dir := tmpDir(t)
	mountTmpfs(t, filepath.Join(dir, "state", "nvme"), 96<<20)
	d := daemonProc(t, dir, map[string]string{envCapacity: "32MiB", envNVMe: "1GiB"})
	ctx := context.Background()
	c := dial(t, socketOf(dir))
	s := open(t, c, testNS("disk-full", bs))

	// Up to 160 MiB through a 32 MiB host tier and a 96 MiB disk: paced
	// until a demotion fails, then 48 more blocks as fast as they come.
	hs := chain(31, 160)
	n := pacedPut(t, d, c, s, hs, 2*time.Second, func(st *client.Stats) bool { return moveStats(st, "host", "nvme").Errors > 0 })
	hs = hs[:min(n+48, len(hs))]
	pacedPut(t, d, c, s, hs[n:], 0, nil)
	alive(t, d)
	st := stats(t, c)
	mv := moveStats(st, "host", "nvme")
	nv := tierStats(st, "nvme")
	t.Logf("after %d MiB: demoted %d, demotion errors %d, nvme blocks %d, nvme disk %d MiB",
		len(hs), mv.Blocks, mv.Errors, nv.Blocks, nv.DiskBytes>>20)
	if mv.Blocks == 0 {
		t.Fatalf("nothing was demoted before the disk filled: %+v", st.Moves)
	}
	if mv.Errors == 0 {
		t.Fatalf("no demotion failed although the filesystem is full (moves %+v, tiers %+v)", st.Moves, st.Tiers)
	}
	// A full disk stays full until something is deleted: a mover that
	// retries block after block on every commit burns CPU and, since a
	// block that could not go down becomes most recently used, turns the
	// host tier's LRU upside down (recent puts get evicted first).
	if mv.Errors > uint64(len(hs)) {
		t.Fatalf("%d failed demotions for %d puts: the mover does not back off from a full disk", mv.Errors, len(hs))
	}
	roundTrip(t, s, 9001)
	if hits := verifyAll(t, s, hs); hits < 16 {
		t.Fatalf("only %d blocks served after the disk filled", hits)
	}
	alive(t, d)

	// Free the disk: delete every block. Once the store has reclaimed the
	// space (its maintenance pass), demotion works again.
	if _, err := s.DeleteBatch(ctx, hs); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := waitStats(t, c, 5*time.Second, func(st *client.Stats) bool { return tierStats(st, "nvme").Blocks == 0 }); !ok {
		t.Fatalf("nvme tier still holds blocks after deleting them all: %+v", stats(t, c).Tiers)
	}
	t0 := time.Now()
	for round := uint64(0); ; round++ {
		before := moveStats(stats(t, c), "host", "nvme")
		more := chain(1000+round, 40)
		pacedPut(t, d, c, s, more, 2*time.Second, nil)
		after := moveStats(stats(t, c), "host", "nvme")
		if after.Blocks-before.Blocks >= 8 && after.Errors == before.Errors {
			t.Logf("demotion works again %v after the delete (round %d: demoted +%d)", time.Since(t0).Round(time.Millisecond), round, after.Blocks-before.Blocks)
			if got := verifyAll(t, s, more); got != len(more) {
				t.Fatalf("%d of %d new blocks served", got, len(more))
			}
			break
		}
		if time.Since(t0) > 20*time.Second {
			t.Fatalf("demotion did not recover within %v of freeing the disk: last round demoted +%d, errors +%d; tiers %+v",
				time.Since(t0).Round(time.Millisecond), after.Blocks-before.Blocks, after.Errors-before.Errors, stats(t, c).Tiers)
		}
		if _, err := s.DeleteBatch(ctx, more); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	s.Close()
	c.Close()
	stopDaemon(t, d, 30*time.Second)
}

// largestDataFile returns the largest value-log or segment file under dir.
func largestDataFile(t *testing.T, dir string) (string, int64) {
	t.Helper()
	var best string
	var size int64
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		if !strings.HasSuffix(p, ".vlog") && !strings.HasSuffix(p, ".seg") {
			return nil
		}
		fi, err := e.Info()
		if err == nil && fi.Size() > size {
			best, size = p, fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if best == "" {
		t.Fatalf("no .vlog or .seg file under %s", dir)
	}
	return best, size
}

// TestFaultCorruptValueBytes: blocks go down to NVMe (small host tier,
// write-down at SIGTERM); with the daemon stopped, bytes in the middle of
// the largest data file are flipped; after a restart every block reads
// back byte-exact or as a miss — never wrong bytes — and the NVMe tier
// counts the checksum misses.
func TestFaultCorruptValueBytes(t *testing.T) {
	const bs = 1 << 20
	dir := tmpDir(t)
	env := map[string]string{envCapacity: "32MiB", envNVMe: "256MiB"}
	d := daemonProc(t, dir, env)
	c := dial(t, socketOf(dir))
	s := open(t, c, testNS("corrupt", bs))
	hs := chain(41, 64)
	pacedPut(t, d, c, s, hs, 5*time.Second, nil)
	if mv := moveStats(stats(t, c), "host", "nvme"); mv.Blocks < 24 || mv.Errors != 0 {
		t.Fatalf("demotions: %+v, want ≥ 24 and no errors", mv)
	}
	s.Close()
	c.Close()
	stopDaemon(t, d, 30*time.Second)

	path, size := largestDataFile(t, filepath.Join(dir, "state", "nvme"))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	off := size/2 - int64(len(buf))/2
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] ^= 0x5a
	}
	if _, err := f.WriteAt(buf, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("flipped %d bytes at %d of %s (%d bytes)", len(buf), off, filepath.Base(path), size)

	d2 := daemonProc(t, dir, env)
	c2 := dial(t, socketOf(dir))
	s2 := open(t, c2, testNS("corrupt", bs))
	hits := verifyAll(t, s2, hs)
	alive(t, d2)
	nv := tierStats(stats(t, c2), "nvme")
	t.Logf("after restart: %d of %d blocks byte-exact, the rest misses; nvme checksum misses %d", hits, len(hs), nv.ChecksumMisses)
	if nv.ChecksumMisses == 0 {
		t.Fatal("no checksum miss counted for the corrupted file")
	}
	if hits < len(hs)/2 {
		t.Fatalf("only %d of %d blocks survived one corrupted 4 KiB range", hits, len(hs))
	}
	// A second pass: the corrupt blocks are gone for good, nothing new fails.
	if again := verifyAll(t, s2, hs); again != hits {
		t.Fatalf("second pass: %d hits, first %d", again, hits)
	}
	roundTrip(t, s2, 4242)
	s2.Close()
	c2.Close()
	stopDaemon(t, d2, 30*time.Second)
}

// TestFaultKillDuringDemotion: a client puts 1 MiB blocks as fast as it
// can into a 32 MiB host tier, so the mover is busy writing to NVMe, and
// the daemon is killed with SIGKILL in the middle. A new daemon on the same
// state dir opens the store; every block the client tried to put is served
// byte-exact or is a miss, never wrong bytes; and the daemon takes new puts.
func TestFaultKillDuringDemotion(t *testing.T) {
	const bs = 1 << 20
	dir := tmpDir(t)
	env := map[string]string{envCapacity: "32MiB", envNVMe: "256MiB"}
	d := daemonProc(t, dir, env)
	c := dial(t, socketOf(dir))
	s := open(t, c, testNS("kill9", bs))

	hs := chain(51, 600)
	var attempted atomic.Int64
	writerDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for i, h := range hs {
			attempted.Store(int64(i + 1))
			if _, err := s.Put(ctx, h, payload(h, bs)); err != nil {
				writerDone <- err
				return
			}
		}
		writerDone <- nil
	}()
	st, waited, ok := waitStats(t, c, 30*time.Second, func(st *client.Stats) bool {
		return moveStats(st, "host", "nvme").Blocks >= 32 && attempted.Load() >= 64
	})
	if !ok {
		t.Fatalf("the mover did not get busy: %+v after %d puts", st.Moves, attempted.Load())
	}
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.done
	werr := <-writerDone
	n := int(attempted.Load())
	t.Logf("killed after %v: %d puts attempted, %d blocks demoted before (writer: %v)", waited, n, moveStats(st, "host", "nvme").Blocks, werr)
	if werr == nil {
		t.Fatal("the writer finished before the kill: not a kill mid-way")
	}
	s.Close()
	c.Close()

	d2 := daemonProc(t, dir, env)
	c2 := dial(t, socketOf(dir))
	s2 := open(t, c2, testNS("kill9", bs))
	nv := tierStats(stats(t, c2), "nvme")
	hits := verifyAll(t, s2, hs[:n])
	t.Logf("after restart: nvme re-indexed %d blocks; %d of %d attempted blocks byte-exact, the rest misses", nv.Blocks, hits, n)
	if nv.Blocks == 0 || hits == 0 {
		t.Fatalf("nothing survived the kill (nvme blocks %d, hits %d)", nv.Blocks, hits)
	}
	alive(t, d2)
	roundTrip(t, s2, 5151)
	more := chain(52, 48)
	pacedPut(t, d2, c2, s2, more, 5*time.Second, nil)
	if got := verifyAll(t, s2, more); got != len(more) {
		t.Fatalf("after restart: %d of %d new blocks served", got, len(more))
	}
	s2.Close()
	c2.Close()
	stopDaemon(t, d2, 30*time.Second)
}
