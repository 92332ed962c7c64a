package cudaipc_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// envMDWE asks the re-run test binary to deny itself writable-and-executable
// memory (prctl PR_SET_MDWE, Linux 6.3+) before it touches a device: what
// systemd's MemoryDenyWriteExecute=yes in systemd/kvtierd.service imposes on
// kvtierd. A driver that JIT-compiles code at initialisation would fail
// there; with -tags cuda on a GPU host this is the check that the unit's
// hardening lets the cuda build drive real GPUs.
const envMDWE = "KVTIER_CUDAIPC_MDWE"

// exitNoMDWE: the kernel has no PR_SET_MDWE.
const exitNoMDWE = 5

// enterMDWE applies the restriction when envMDWE is set; it runs in TestMain
// before any device is opened.
func enterMDWE() {
	if os.Getenv(envMDWE) == "" {
		return
	}
	if err := unix.Prctl(unix.PR_SET_MDWE, unix.PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0); err != nil {
		os.Stderr.WriteString("prctl(PR_SET_MDWE): " + err.Error() + "\n")
		os.Exit(exitNoMDWE)
	}
	// Check that it holds: a writable and executable anonymous mapping must
	// now be refused.
	if b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANON); err == nil {
		unix.Munmap(b)
		os.Stderr.WriteString("PR_SET_MDWE set but a W+X mapping was granted\n")
		os.Exit(exitFailed)
	}
}

// TestUnderMemoryDenyWriteExecute re-runs the device conformance tests (a
// copy round trip, page-locked host memory, peer copies, an IPC handle
// opened by another process) in a process that may not create W+X memory,
// as kvtierd under its unit. Default build: the emulation (and so the Go
// runtime and our code). cuda build: the real driver.
func TestUnderMemoryDenyWriteExecute(t *testing.T) {
	devices(t, 1) // skips without a device
	const tests = "^(TestEnumerate|TestAllocFree|TestRoundTrip|TestHostRegister|TestPeerCopy|TestIPCOtherProcess)$"
	cmd := exec.Command(os.Args[0], "-test.run="+tests, "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envMDWE+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	switch code := cmd.ProcessState.ExitCode(); code {
	case 0:
	case exitNoMDWE:
		t.Skipf("kernel without PR_SET_MDWE (Linux 6.3+): %s", strings.TrimSpace(out.String()))
	default:
		t.Fatalf("device tests under MemoryDenyWriteExecute exited %d:\n%s", code, out.String())
	}
	// Each must have run, not skipped (a second GPU may be missing for the
	// peer copy, which then skips in the parent too).
	for _, name := range []string{"TestEnumerate", "TestAllocFree", "TestRoundTrip", "TestHostRegister", "TestIPCOtherProcess"} {
		if !strings.Contains(out.String(), "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass under MemoryDenyWriteExecute:\n%s", name, out.String())
		}
	}
}
