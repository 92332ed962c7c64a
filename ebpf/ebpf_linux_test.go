package ebpf

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestExitTracer(t *testing.T) {
	requireBPF(t)
	tr, err := OpenExitTracer(Env{})
	skipUnavailable(t, err)
	defer tr.Close()

	// An unwatched process dies first: no event for it.
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	watched := exec.Command("sleep", "30")
	if err := watched.Start(); err != nil {
		t.Fatal(err)
	}
	pid := uint32(watched.Process.Pid)
	for range 2 { // two sessions of one process
		if err := tr.Add(pid); err != nil {
			t.Fatal(err)
		}
	}
	other.Process.Kill()
	other.Wait()
	t0 := time.Now()
	watched.Process.Kill()
	got := make(chan ExitEvent, 1)
	go func() {
		ev, err := tr.Read()
		if err != nil {
			t.Error(err)
		}
		got <- ev
	}()
	select {
	case ev := <-got:
		if ev.Tgid != pid {
			t.Fatalf("exit event for pid %d, want %d", ev.Tgid, pid)
		}
		t.Logf("exit event %v after kill", time.Since(t0))
	case <-time.After(5 * time.Second):
		t.Fatal("no exit event within 5s of the kill")
	}
	watched.Wait()
	tr.Remove(pid)
	if tr.Watched() != 1 {
		t.Fatalf("watched %d after one of two removes, want 1", tr.Watched())
	}
	tr.Remove(pid)
	if tr.Watched() != 0 {
		t.Fatalf("watched %d after both removes", tr.Watched())
	}
	// Close unblocks a reader.
	done := make(chan error, 1)
	go func() { _, err := tr.Read(); done <- err }()
	time.Sleep(20 * time.Millisecond)
	tr.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Read after Close: %v, want os.ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not unblock Read")
	}
}

func TestIOLatency(t *testing.T) {
	requireBPF(t)
	dir := t.TempDir()
	dev, err := DisksOf(dir)
	skipUnavailable(t, err)
	t.Logf("%s is on %v", dir, dev)
	l, err := OpenIOLatency(Env{}, dev)
	skipUnavailable(t, err)
	defer l.Close()

	directIO(t, dir)
	for op, name := range OpNames {
		h, err := l.Read(op)
		if err != nil {
			t.Fatal(err)
		}
		count, sum, _ := h.Cumulative()
		t.Logf("%s: %d requests, mean %v", name, count, time.Duration(sum/float64(max(count, 1))*1e9))
		if count < 1 {
			t.Errorf("no %s requests seen on %v", name, dev)
		}
	}
}

// directIO writes then reads 64 x 64 KiB with O_DIRECT under dir, which
// reaches the disk for sure. It skips t where O_DIRECT is unsupported.
func directIO(t *testing.T, dir string) {
	t.Helper()
	directIOAt(t, filepath.Join(dir, "f"), os.O_CREATE)
}

// directIOAt is directIO on path (a file, or a block device with flag 0).
func directIOAt(t *testing.T, path string, flag int) {
	t.Helper()
	f, err := os.OpenFile(path, flag|os.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Skipf("O_DIRECT unsupported here: %v", err)
	}
	defer f.Close()
	buf, err := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	for i := range 64 {
		if _, err := f.WriteAt(buf, int64(i)<<16); err != nil {
			t.Fatal(err)
		}
	}
	f.Sync()
	for i := range 64 {
		if _, err := f.ReadAt(buf, int64(i)<<16); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReclaimProbeLoads(t *testing.T) {
	requireBPF(t)
	p, err := OpenReclaimProbe(Env{})
	skipUnavailable(t, err)
	defer p.Close()
	s, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("direct reclaim since load: %+v", s)
}

// TestMissingFeatures: each loader fails with ErrUnavailable, naming what
// is missing, when BTF is absent (no privileges needed). tracefs is not
// needed (TestLoadersUnprivileged runs them where it cannot be read).
func TestMissingFeatures(t *testing.T) {
	for name, env := range map[string]Env{
		"no BTF": {BTF: "/nonexistent/vmlinux"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err1 := OpenExitTracer(env)
			_, err2 := OpenIOLatency(env, []Device{{Major: 254}})
			_, err3 := OpenReclaimProbe(env)
			for _, err := range []error{err1, err2, err3} {
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("err = %v, want ErrUnavailable", err)
				}
			}
			t.Log(err1)
		})
	}
}

func TestDisksOfNotBlock(t *testing.T) {
	if _, err := DisksOf("/proc"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("DisksOf(/proc) = %v, want ErrUnavailable", err)
	}
}
