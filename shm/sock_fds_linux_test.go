package shm

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// recvOutOfFDsChild makes the test binary run the receiving side of
// TestRecvMsgOutOfFDs, with its own fd limit lowered (never the test
// process's).
const recvOutOfFDsChild = "KVTIER_SHM_RECV_OUT_OF_FDS"

// TestRecvMsgOutOfFDs: a process out of file descriptors (an inference
// engine at its RLIMIT_NOFILE) receives a message whose fds the kernel
// cannot install: it drops them and sets MSG_CTRUNC. RecvMsg reported that
// as the peer's fault, "unexpected file descriptors: got 0 fds, at most 2
// allowed", so a client that could not take the daemon's Welcome blamed
// the daemon. It must say that this process is out of fds, and the error
// must match unix.EMFILE.
func TestRecvMsgOutOfFDs(t *testing.T) {
	if os.Getenv(recvOutOfFDsChild) == "1" {
		recvOutOfFDs(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRecvMsgOutOfFDs$", "-test.v")
	cmd.Env = append(os.Environ(), recvOutOfFDsChild+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestRecvMsgOutOfFDs") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func recvOutOfFDs(t *testing.T) {
	a, b := seqpacketPair(t)
	send := pipeFDs(t, 2)
	if err := SendMsg(a, []byte("welcome"), send...); err != nil {
		t.Fatal(err)
	}
	// No fd number left below the limit: the kernel can install none.
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = uint64(fd)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	_, fds, err := RecvMsg(b, make([]byte, 64), 2)
	if err == nil || len(fds) != 0 {
		t.Fatalf("RecvMsg = %d fds, %v; want an error", len(fds), err)
	}
	if !errors.Is(err, unix.EMFILE) || errors.Is(err, ErrTooManyFDs) || !strings.Contains(err.Error(), "out of file descriptors") {
		t.Errorf("RecvMsg: %v; want this process's shortage of fds named (unix.EMFILE), not the peer blamed", err)
	}
}
