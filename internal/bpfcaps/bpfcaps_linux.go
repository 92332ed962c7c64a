package bpfcaps

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// UID and GID are the unprivileged identity: nobody/nogroup.
const (
	UID = 65534
	GID = 65534
)

// Want is the effective capability set the child must have.
const Want = uint64(1)<<unix.CAP_BPF | uint64(1)<<unix.CAP_PERFMON

// Command returns a command that runs this test binary with args as UID
// with only CAP_BPF and CAP_PERFMON (ambient, so they survive the exec).
// It skips t unless the test runs as root. The binary is copied to a
// directory UID can read: go test builds it under a 0700 directory.
func Command(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as another uid with CAP_BPF and CAP_PERFMON")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("find the test binary: %v", err)
	}
	dir, err := os.MkdirTemp("", "kvtier-bpfcaps-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, filepath.Base(self))
	if err := copyFile(bin, self); err != nil {
		t.Fatalf("copy the test binary for uid %d: %v", UID, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: UID, Gid: GID, Groups: []uint32{}},
		AmbientCaps: []uintptr{unix.CAP_BPF, unix.CAP_PERFMON},
	}
	return cmd
}

// CombinedOutput runs cmd (from Command) and returns its output. It skips
// t when the child cannot be started with those capabilities (a kernel
// before 5.8 has no CAP_BPF; a container may keep them out of the bounding
// set), and returns a non-nil error for a child that ran and failed.
func CombinedOutput(t testing.TB, cmd *exec.Cmd) ([]byte, error) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		t.Skipf("cannot start a child as uid %d with only CAP_BPF and CAP_PERFMON ambient: %v", UID, err)
	}
	return out, err
}

// Verify fails t unless this process runs as a uid other than 0 with
// exactly CAP_BPF and CAP_PERFMON effective: the child's side of Command,
// so that a test cannot pass with more privileges than it claims.
func Verify(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		t.Fatal("running as root, want an unprivileged uid")
	}
	eff, err := effectiveCaps()
	if err != nil {
		t.Fatal(err)
	}
	if eff != Want {
		t.Fatalf("effective capabilities %#x, want CAP_BPF|CAP_PERFMON (%#x)", eff, Want)
	}
}

func effectiveCaps() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read capabilities: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("parse CapEff %q: %w", v, err)
			}
			return eff, nil
		}
	}
	return 0, fmt.Errorf("no CapEff line in /proc/self/status")
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
