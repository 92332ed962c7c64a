package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// pidsCgroupV1 is where the v1 pids controller is mounted.
const pidsCgroupV1 = "/sys/fs/cgroup/pids"

// limitTasks moves process pid into a new v1 pids cgroup that allows it
// extra more tasks (threads) than it has now: a unit's TasksMax=, a
// container's pids limit.
func limitTasks(t *testing.T, pid, extra int) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pidsCgroupV1, "cgroup.procs")); err != nil {
		t.Skipf("no v1 pids cgroup controller: %v", err)
	}
	cg := filepath.Join(pidsCgroupV1, fmt.Sprintf("kvtier-test-%d", pid))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Skipf("cannot create a pids cgroup: %v", err)
	}
	t.Cleanup(func() { // before kvtierd's (cleanups run last first)
		os.WriteFile(filepath.Join(pidsCgroupV1, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
		for deadline := time.Now().Add(5 * time.Second); os.Remove(cg) != nil && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	})
	n := threadsOf(t, pid)
	if err := os.WriteFile(filepath.Join(cg, "pids.max"), []byte(strconv.Itoa(n+extra)), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatal(err)
	}
}

func threadsOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line")
	return 0
}

// TestTaskLimitRefusesSessions: every idle session's ring loop sleeps in a
// futex wait, which holds an OS thread. Under a task limit (systemd's
// TasksMax=, a container's pids limit) the thread for one session too many
// could not be created, and the Go runtime aborted kvtierd: every session
// of every engine on the host went with it ("runtime/cgo: pthread_create
// failed: Resource temporarily unavailable"). Sessions past what the limit
// leaves (with a reserve for the runtime) must be refused, busy, and the
// daemon serve on.
func TestTaskLimitRefusesSessions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvtierd.toml")
	if err := os.WriteFile(path, []byte("[host]\nslab_bytes = \"1MiB\"\nprefault = false\ncapacity = \"8MiB\"\n[nvme]\nenabled = false\n[ebpf]\nenabled = false\n[session]\nspin_us = 0\nring_entries = 64\ndata_bytes = \"64KiB\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := startKVTierd(t, path)
	pid := k.cmd.Process.Pid
	// The daemon's reserve (64 + 4 Ps per CPU) and room for 4 sessions.
	limitTasks(t, pid, 64+4*runtime.GOMAXPROCS(0)+4)

	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: k.socket, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns := client.Namespace{ModelID: "m", Layers: 1, KVHeads: 1, HeadDim: 1, DType: "fp16", TokensPerBlock: 1, TPSize: 1, BlockBytes: 4096}
	var held []*client.Session
	defer func() {
		for _, s := range held {
			s.Close()
		}
	}()
	var refused error
	for range 200 {
		s, err := c.Open(ctx, ns)
		if err != nil {
			refused = err
			break
		}
		held = append(held, s)
	}
	t.Logf("refused after %d sessions: %v", len(held), refused)
	var ref *client.RefusedError
	if !errors.As(refused, &ref) {
		if why, dead := exited(k); dead {
			t.Fatalf("kvtierd died after %d sessions: %s", len(held), why)
		}
	}
	if !errors.As(refused, &ref) || ref.Code != shm.CodeBusy || !strings.Contains(ref.Message, "threads") {
		t.Fatalf("after %d sessions: %v; want a busy refusal naming the threads", len(held), refused)
	}
	// The sessions held work, and once they close a new one opens.
	for _, s := range held {
		if _, err := s.Lookup(ctx, []client.Hash{{Hi: 1}}); err != nil {
			t.Fatalf("a held session after the refusal: %v", err)
		}
		s.Close()
	}
	held = nil
	openAgain(ctx, t, c, ns, "the others closed")
}

// exited reports whether kvtierd's stderr ends (it exited) within 3 s
// (reading it meanwhile: a crash dump fills the pipe), with the runtime's
// last words.
func exited(k *kvtierd) (string, bool) {
	var why []string
	for deadline := time.After(3 * time.Second); ; {
		select {
		case l, ok := <-k.lines:
			if !ok {
				return strings.Join(why, "; "), true
			}
			if strings.Contains(l, "pthread_create") || strings.HasPrefix(l, "fatal") || strings.HasPrefix(l, "runtime:") {
				why = append(why, l)
			}
		case <-deadline:
			return strings.Join(why, "; "), false
		}
	}
}
