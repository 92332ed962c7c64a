package main

import (
	"bufio"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSIGTERMDuringStartup: a SIGTERM that comes while kvtierd is still
// starting (in production: reindexing a large NVMe tier, which may take
// minutes) stops it there, with status 0: no socket bound, no READY=1 to
// systemd. kvtierd ignored it until start-up was over, then bound the
// socket, told systemd READY=1 and only then drained, so `systemctl stop`
// during a long reindex waited for all of it (and was SIGKILLed at
// TimeoutStopSec). The start-up is held at a known point by making the
// namespace registry a FIFO, whose read blocks until the test writes it.
func TestSIGTERMDuringStartup(t *testing.T) {
	dir := t.TempDir()
	state, run := filepath.Join(dir, "state"), filepath.Join(dir, "run")
	if err := os.MkdirAll(state, 0o750); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(state, "namespaces.json")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "kvtierd.toml")
	if err := os.WriteFile(config, []byte("[host]\ncapacity = \"8MiB\"\nslab_bytes = \"1MiB\"\nprefault = false\n"+
		"[nvme]\nenabled = true\ncapacity = \"64MiB\"\n[ebpf]\nenabled = false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	notifyPath := filepath.Join(dir, "notify.sock")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()

	args := []string{"-config", config, "-runtime-dir", run, "-state-dir", state, "-metrics-listen", ""}
	k := &kvtierd{socket: filepath.Join(run, "kvtierd.sock"), lines: make(chan string, 1024)}
	k.cmd = exec.Command(os.Args[0], "-test.run=^$")
	k.cmd.Env = append(os.Environ(), childEnv+"=1", childArgsEnv+"="+strings.Join(args, "\n"), "NOTIFY_SOCKET="+notifyPath)
	stderr, err := k.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log []string
	go func() {
		defer close(k.lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			k.lines <- sc.Text()
		}
	}()
	var w *os.File
	t.Cleanup(func() {
		if w != nil {
			w.Close() // frees a kvtierd still reading the registry
		}
		k.cmd.Process.Kill()
		for range k.lines {
		}
		k.cmd.Wait()
	})

	// Wait for kvtierd to open the registry for reading: it stays blocked
	// in that open (a reader) until a writer comes, so the state cannot be
	// missed. Then it reads until the writer closes.
	deadline := time.Now().Add(20 * time.Second)
	for w == nil {
		f, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0)
		switch {
		case err == nil:
			w = f
		case errors.Is(err, unix.ENXIO) && time.Now().Before(deadline):
			time.Sleep(5 * time.Millisecond)
		default:
			t.Fatalf("kvtierd did not open its namespace registry: %v", err)
		}
	}
	if err := k.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Once kvtierd says so, its stop is in effect; the start-up then goes
	// on. A kvtierd that never says so is let go on too, to show what it
	// does with the SIGTERM.
	timeout := time.After(20 * time.Second)
wait:
	for {
		select {
		case l, ok := <-k.lines:
			if !ok {
				t.Fatal("kvtierd exited before it could read its namespace registry")
			}
			log = append(log, l)
			if strings.Contains(l, "stop requested") {
				break wait
			}
		case <-timeout:
			t.Error("kvtierd did not log \"stop requested\" within 20s of a SIGTERM")
			break wait
		}
	}
	if err := w.Close(); err != nil { // an empty registry: a fresh one
		t.Fatal(err)
	}
	w = nil
	for l := range k.lines {
		log = append(log, l)
	}
	if err := k.cmd.Wait(); err != nil {
		t.Errorf("kvtierd exit after a SIGTERM during start-up: %v, want status 0", err)
	}
	for _, l := range log {
		if strings.Contains(l, "kvtierd listening") {
			t.Errorf("kvtierd bound its socket after a SIGTERM during start-up: %s", l)
		}
	}
	if _, err := os.Stat(k.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket %s after kvtierd exited: %v, want none", k.socket, err)
	}
	// kvtierd has exited: everything it sent is queued, and read at once
	// (a deadline already past would read nothing).
	if err := notify.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 4096), make([]byte, 1024)
	notified := 0
	for {
		n, oobn, _, _, err := notify.ReadMsgUnix(buf, oob)
		if err != nil {
			break
		}
		if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if fds, ferr := unix.ParseUnixRights(&m); ferr == nil {
					for _, fd := range fds {
						unix.Close(fd)
					}
				}
			}
		}
		notified++
		if msg := string(buf[:n]); strings.Contains(msg, "READY=1") {
			t.Errorf("kvtierd told systemd %q after a SIGTERM during start-up", msg)
		}
	}
	t.Logf("%d sd_notify messages; kvtierd's log:\n%s", notified, strings.Join(log, "\n"))
}
