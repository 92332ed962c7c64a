package ebpf

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// memoryCgroup creates a child memory cgroup limited to limit bytes (v2
// memory.max where the unified hierarchy has the memory controller, else
// v1 memory.limit_in_bytes) and returns the file to write a pid into.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	name := fmt.Sprintf("kvtier-test-%d", os.Getpid())
	try := []struct{ root, limitFile, procs string }{
		{"/sys/fs/cgroup", "memory.max", "cgroup.procs"},
		{"/sys/fs/cgroup/unified", "memory.max", "cgroup.procs"},
		{"/sys/fs/cgroup/memory", "memory.limit_in_bytes", "cgroup.procs"},
	}
	for _, c := range try {
		if c.limitFile == "memory.max" {
			b, err := os.ReadFile(filepath.Join(c.root, "cgroup.controllers"))
			if err != nil || !strings.Contains(string(b), "memory") {
				continue
			}
			os.WriteFile(filepath.Join(c.root, "cgroup.subtree_control"), []byte("+memory"), 0)
		} else if _, err := os.Stat(filepath.Join(c.root, c.limitFile)); err != nil {
			continue
		}
		dir := filepath.Join(c.root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			continue
		}
		t.Cleanup(func() {
			for i := 0; i < 50 && os.Remove(dir) != nil; i++ {
				time.Sleep(20 * time.Millisecond) // the killed hog leaves
			}
		})
		if err := os.WriteFile(filepath.Join(dir, c.limitFile), []byte(fmt.Sprint(limit)), 0); err != nil {
			t.Fatalf("limit %s: %v", dir, err)
		}
		os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0)
		return filepath.Join(dir, c.procs)
	}
	t.Skip("no memory cgroup (v2 memory controller or v1 memory hierarchy) to create")
	return ""
}

// TestControllerCgroupHog induces real memory pressure: a bounded hog in a
// 32 MiB memory cgroup writes and reads files far larger than that, so
// every page it charges is reclaimed in the cgroup, a memory stall that
// PSI counts host-wide too. The controller (PSI source, 250 ms samples)
// must shrink the target under it and grow it back once the hog is gone.
// The vmscan probe counts global direct reclaim only, which a cgroup limit
// does not cause; PSI is the signal here.
func TestControllerCgroupHog(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a memory cgroup")
	}
	if _, err := ReadPSI(DefaultPSIPath); err != nil {
		t.Skipf("no PSI: %v", err)
	}
	procs := memoryCgroup(t, 32<<20)
	dir := t.TempDir()
	script := `echo $$ > "$1"; while :; do dd if=/dev/zero of="$2/hog" bs=1M count=128 status=none; cat "$2/hog" > /dev/null; done`
	hog := exec.Command("sh", "-c", script, "hog", procs, dir)
	hog.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	ch := newFakeChain(0.95, 0.85)
	c := NewController(ControllerConfig{Interval: 250 * time.Millisecond, Calm: 2}, &PSI{Path: DefaultPSIPath}, ch, DefaultPSIPath, nil)
	c.src.Pressure(c.cfg.Interval)
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		syscall.Kill(-hog.Process.Pid, syscall.SIGKILL)
		hog.Wait()
	}
	defer stop()
	t0 := time.Now()
	var peak float64
	for time.Since(t0) < 15*time.Second && c.State().Shrinks == 0 {
		time.Sleep(c.cfg.Interval)
		c.Step()
		peak = max(peak, c.State().Pressure)
	}
	s := c.State()
	if s.Shrinks == 0 {
		t.Skipf("the cgroup hog raised host PSI to at most %.1f%% in 15s (threshold %v%%): no reliable signal on this kernel/VM; TestControllerHysteresis covers the controller with a faked source", peak, c.cfg.High)
	}
	t.Logf("under pressure (%.1f%% stalled, avg10 %.2f): target %v after %v, high watermark %.3f",
		s.Pressure, s.SomeAvg10, s.TargetRatio, time.Since(t0).Round(time.Millisecond), ch.high)
	stop()
	t1 := time.Now()
	for time.Since(t1) < 20*time.Second && c.State().TargetRatio < 1 {
		time.Sleep(c.cfg.Interval)
		c.Step()
	}
	s = c.State()
	if s.TargetRatio != 1 || ch.high != 0.95 || ch.low != 0.85 {
		t.Fatalf("pressure gone for %v: target %v, watermarks %v/%v", time.Since(t1), s.TargetRatio, ch.high, ch.low)
	}
	t.Logf("pressure gone: target back to 1 in %v (%d shrinks, %d grows)", time.Since(t1).Round(time.Millisecond), s.Shrinks, s.Grows)
}
