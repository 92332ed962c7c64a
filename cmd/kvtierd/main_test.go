package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/client"
)

// childEnv makes the test binary run kvtierd's main with the arguments in
// childArgsEnv (newline-separated) instead of the tests: a real kvtierd process,
// signals and all.
const (
	childEnv     = "KVTIERD_TEST_MAIN"
	childArgsEnv = "KVTIERD_TEST_ARGS"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Args = append([]string{"kvtierd"}, strings.Split(os.Getenv(childArgsEnv), "\n")...)
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// kvtierd is a kvtierd process started by startKVTierd.
type kvtierd struct {
	cmd    *exec.Cmd
	socket string
	lines  chan string // stderr, line by line; closed at exit
}

// startKVTierd runs kvtierd with the config file path (and a runtime and
// state dir of its own, no metrics) and waits until it serves.
func startKVTierd(t *testing.T, config string) *kvtierd {
	t.Helper()
	dir := t.TempDir()
	k := &kvtierd{socket: filepath.Join(dir, "run", "kvtierd.sock"), lines: make(chan string, 1024)}
	args := []string{"-config", config, "-runtime-dir", filepath.Join(dir, "run"), "-state-dir", filepath.Join(dir, "state"),
		"-metrics-listen", ""}
	k.cmd = exec.Command(os.Args[0], "-test.run=^$")
	k.cmd.Env = append(os.Environ(), childEnv+"=1", childArgsEnv+"="+strings.Join(args, "\n"))
	stderr, err := k.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(k.lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			k.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		k.cmd.Process.Signal(syscall.SIGTERM)
		for range k.lines {
		}
		k.cmd.Wait()
	})
	k.waitLog(t, "kvtierd listening")
	return k
}

// waitLog waits for the next stderr line containing what.
func (k *kvtierd) waitLog(t *testing.T, what string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-k.lines:
			if !ok {
				t.Fatalf("kvtierd exited before logging %q", what)
			}
			if strings.Contains(l, what) {
				return
			}
		case <-deadline:
			t.Fatalf("kvtierd did not log %q within 20s", what)
		}
	}
}

// reload rewrites the config file and sends SIGHUP, then waits for the
// reload to be done.
func (k *kvtierd) reload(t *testing.T, path, config string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := k.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	k.waitLog(t, "configuration reloaded")
}

func (k *kvtierd) hostCapacity(t *testing.T) int64 {
	t.Helper()
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: k.socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range st.Tiers {
		if tt.Name == "host" {
			return tt.CapacityBytes
		}
	}
	t.Fatalf("no host tier in %+v", st.Tiers)
	return 0
}

// TestReloadHostCapacityUnset: a reload that shrank the host tier's target
// (host.capacity smaller than the arena) is undone by a reload with
// host.capacity unset or 0, which keeps the running arena's size (the
// example config: "0 keeps the running arena's size"). kvtierd read the
// file again with the target in effect standing in for an unset
// host.capacity, so a shrink could only be undone by writing the arena's
// exact size into the file, or by a restart.
func TestReloadHostCapacityUnset(t *testing.T) {
	const arena = 8 << 20
	path := filepath.Join(t.TempDir(), "kvtierd.toml")
	file := func(capacity string) string {
		return "[host]\nslab_bytes = \"1MiB\"\nprefault = false\n" + capacity + "\n[nvme]\nenabled = false\n[ebpf]\nenabled = false\n"
	}
	if err := os.WriteFile(path, []byte(file(`capacity = "8MiB"`)), 0o644); err != nil {
		t.Fatal(err)
	}
	k := startKVTierd(t, path)
	if got := k.hostCapacity(t); got != arena {
		t.Fatalf("host capacity at start %d, want %d", got, arena)
	}
	k.reload(t, path, file(`capacity = "4MiB"`))
	if got := k.hostCapacity(t); got != 4<<20 {
		t.Fatalf("host capacity after a reload to 4MiB: %d", got)
	}
	for _, tt := range []struct{ name, line string }{
		{"unset", ""},
		{"shrunk again", `capacity = "4MiB"`},
		{"0", "capacity = 0"},
	} {
		k.reload(t, path, file(tt.line))
		want := int64(arena)
		if tt.line != "" && tt.line != "capacity = 0" {
			want = 4 << 20
		}
		if got := k.hostCapacity(t); got != want {
			t.Errorf("host.capacity %s: host capacity after the reload %d, want %d", tt.name, got, want)
		}
	}
}
