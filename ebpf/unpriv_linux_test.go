package ebpf

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/internal/bpfcaps"
)

const unprivHelperEnv = "KVTIER_TEST_EBPF_UNPRIV"

// TestLoadersUnprivileged runs every loader as uid 65534 with only
// CAP_BPF and CAP_PERFMON, what the systemd unit grants: there tracefs
// (root-only) cannot be read, so the probes must attach without it. The
// exit probe must deliver an event; the NVMe and vmscan programs must
// attach (the NVMe one skips where the temporary directory has no disk).
func TestLoadersUnprivileged(t *testing.T) {
	requireBPF(t)
	cmd := bpfcaps.Command(t, "-test.run=^TestUnprivilegedHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(cmd.Env, unprivHelperEnv+"=1")
	out, err := bpfcaps.CombinedOutput(t, cmd)
	s := string(out)
	if err != nil {
		t.Fatalf("loaders as uid %d with CAP_BPF+CAP_PERFMON: %v\n%s", bpfcaps.UID, err, s)
	}
	for _, sub := range []string{"exit", "vmscan"} {
		if !strings.Contains(s, "--- PASS: TestUnprivilegedHelper/"+sub+" ") {
			t.Errorf("%s did not pass unprivileged:\n%s", sub, s)
		}
	}
	if !strings.Contains(s, "--- PASS: TestUnprivilegedHelper/nvme_io ") &&
		!strings.Contains(s, "--- SKIP: TestUnprivilegedHelper/nvme_io ") {
		t.Errorf("nvme_io neither passed nor skipped unprivileged:\n%s", s)
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "unpriv_linux_test.go") || strings.HasPrefix(strings.TrimSpace(l), "---") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// TestUnprivilegedHelper is not a test: it is the child of
// TestLoadersUnprivileged (uid 65534, CAP_BPF and CAP_PERFMON only).
func TestUnprivilegedHelper(t *testing.T) {
	if os.Getenv(unprivHelperEnv) == "" {
		t.Skip("helper process of TestLoadersUnprivileged")
	}
	bpfcaps.Verify(t)
	if err := (Env{}).Check(); err != nil {
		t.Fatal(err)
	}
	// The premise: the classic tracepoints' ids are out of reach here.
	if _, err := os.ReadFile("/sys/kernel/tracing/events/sched/sched_process_exit/id"); err != nil {
		t.Logf("tracefs unreadable as uid %d: %v", os.Geteuid(), err)
	} else {
		t.Logf("tracefs readable as uid %d (mounted with a wider mode)", os.Geteuid())
	}

	t.Run("exit", func(t *testing.T) {
		tr, err := OpenExitTracer(Env{})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		watched := exec.Command("sleep", "30")
		if err := watched.Start(); err != nil {
			t.Fatal(err)
		}
		pid := uint32(watched.Process.Pid)
		if err := tr.Add(pid); err != nil {
			t.Fatal(err)
		}
		got := make(chan ExitEvent, 1)
		go func() {
			ev, err := tr.Read()
			if err != nil && !errors.Is(err, os.ErrClosed) {
				t.Error(err)
			}
			got <- ev
		}()
		watched.Process.Kill()
		watched.Wait()
		select {
		case ev := <-got:
			if ev.Tgid != pid {
				t.Fatalf("exit event for pid %d, want %d", ev.Tgid, pid)
			}
			t.Logf("exit event for pid %d", pid)
		case <-time.After(5 * time.Second):
			tr.Close()
			<-got
			t.Fatal("no exit event within 5s of the kill")
		}
	})

	t.Run("nvme_io", func(t *testing.T) {
		dir := t.TempDir()
		dev, err := DisksOf(dir)
		skipUnavailable(t, err)
		l, err := OpenIOLatency(Env{}, dev)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		directIO(t, dir)
		for op, name := range OpNames {
			h, err := l.Read(op)
			if err != nil {
				t.Fatal(err)
			}
			count, _, _ := h.Cumulative()
			t.Logf("%s on %s: %d requests", name, dev, count)
			if count < 1 {
				t.Errorf("no %s requests seen on %s", name, dev)
			}
		}
	})

	t.Run("vmscan", func(t *testing.T) {
		p, err := OpenReclaimProbe(Env{})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, err := p.Read(); err != nil {
			t.Fatal(err)
		}
		t.Log("vmscan programs attached")
	})
}
