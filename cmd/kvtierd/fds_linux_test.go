package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// leaveFreeFDs lowers process pid's soft RLIMIT_NOFILE so that exactly free
// fd numbers below it are unused (the kernel hands out the lowest free one).
func leaveFreeFDs(t *testing.T, pid, free int) {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	used := map[int]bool{}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		used[n] = true
	}
	limit, unused := 0, 0
	for unused < free || used[limit] {
		if !used[limit] {
			unused++
		}
		limit++
	}
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(limit), Max: old.Max}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestOutOfFDsRefusesClearly: kvtierd runs with a finite RLIMIT_NOFILE and
// every session holds two fds (its socket and its ring's memfd). Once its
// sessions hold them all, a new peer must be refused with a reason it and
// the operator can act on (busy: out of file descriptors), and served again
// once sessions close. Before, with one fd left (the accept took it) the
// peer was refused "cannot create ring region" as an internal error, and
// the daemon logged nothing; with none left, the connection sat in the
// backlog unanswered until the client's handshake timed out, which the
// client reports as a lost connection (ErrDisconnected).
func TestOutOfFDsRefusesClearly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvtierd.toml")
	if err := os.WriteFile(path, []byte("[host]\nslab_bytes = \"1MiB\"\nprefault = false\ncapacity = \"8MiB\"\n[nvme]\nenabled = false\n[ebpf]\nenabled = false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := client.Namespace{ModelID: "m", Layers: 1, KVHeads: 1, HeadDim: 1, DType: "fp16", TokensPerBlock: 1, TPSize: 1, BlockBytes: 4096}
	for _, tt := range []struct {
		name string
		free int // fds left when the peer connects
	}{
		{"no fd for the accept", 0},
		{"no fd for the ring", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := startKVTierd(t, path)
			ctx := context.Background()
			const dialTimeout = 8 * time.Second
			c, err := client.Dial(ctx, client.Options{Socket: k.socket, DialTimeout: dialTimeout})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var held []*client.Session
			defer func() {
				for _, s := range held {
					s.Close()
				}
			}()
			for range 2 { // every lazily opened fd of the daemon is open
				s, err := c.Open(ctx, ns)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, s)
			}
			leaveFreeFDs(t, k.cmd.Process.Pid, tt.free)

			t0 := time.Now()
			s, err := c.Open(ctx, ns)
			took := time.Since(t0)
			if err == nil {
				s.Close()
				t.Fatal("a session opened with no fds left for it")
			}
			var ref *client.RefusedError
			if !errors.As(err, &ref) || ref.Code != shm.CodeBusy || !strings.Contains(ref.Message, "file descriptors") {
				t.Errorf("refused after %v with %v; want a busy refusal naming the file descriptors", took.Round(time.Millisecond), err)
			}
			if took > dialTimeout/2 {
				t.Errorf("the refusal took %v", took)
			}
			k.waitLog(t, "out of file descriptors")

			// Sessions close: fds are back, and so is service.
			for _, s := range held {
				s.Close()
			}
			held = nil
			openAgain(ctx, t, c, ns, "fds were freed")
		})
	}
}

// openAgain opens (and closes) a session within 5 s of what freed room for
// it, or fails the test.
func openAgain(ctx context.Context, t *testing.T, c *client.Client, ns client.Namespace, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := c.Open(ctx, ns)
		if err == nil {
			s.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session 5s after %s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dialAs connects to socket with effective uid uid (SO_PEERCRED reports
// the connecting thread's euid), keeping file access as root (fsuid 0). The
// credentials change on one locked OS thread only, which exits with its
// goroutine. Needs root.
func dialAs(t *testing.T, socket string, uid int) *net.UnixConn {
	t.Helper()
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			ch <- result{-1, fmt.Errorf("setresuid: %w", e)}
			return
		}
		unix.RawSyscall(unix.SYS_SETFSUID, 0, 0, 0) // path access as root; returns the old fsuid
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			if err = unix.Connect(fd, &unix.SockaddrUnix{Name: socket}); err != nil {
				unix.Close(fd)
			}
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("connect as uid %d: %v", uid, r.err)
	}
	f := os.NewFile(uintptr(r.fd), "peer")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn)
}

// TestOutOfFDsUnauthorizedGetsNothing: a peer whose uid is not allowed must
// learn nothing of the daemon but that it is not allowed. While kvtierd was
// out of file descriptors, the peer taken on the spare fd was refused busy
// before its credentials were checked: an unauthorized one was told the
// daemon's state and its fd limit.
func TestOutOfFDsUnauthorizedGetsNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (connects as another uid)")
	}
	k, _, _ := startWarmedUp(t, "[auth]\nuids = [0]\n")
	leaveFreeFDs(t, k.cmd.Process.Pid, 0)

	cn := dialAs(t, k.socket, 54321)
	cn.SetReadDeadline(time.Now().Add(8 * time.Second))
	raw, _, err := shm.RecvMsg(cn, make([]byte, 4096), 0)
	if err != nil {
		t.Fatalf("no answer to the unauthorized peer: %v", err)
	}
	typ, _, p, err := shm.DecodeMsg(raw)
	if err != nil || typ != shm.MsgError {
		t.Fatalf("answer: type %d, %v; want an error message", typ, err)
	}
	e, err := shm.DecodeError(p)
	if err != nil {
		t.Fatal(err)
	}
	if e.Code != shm.CodeUnauthorized || strings.Contains(e.Message, "file descriptor") {
		t.Fatalf("unauthorized peer refused with code %d %q; want only code %d (unauthorized)", e.Code, e.Message, shm.CodeUnauthorized)
	}
}

// startWarmedUp starts a small kvtierd (8 MiB host tier, no NVMe, no eBPF;
// extra is prepended to its config) and opens and holds two sessions until
// the test ends, so that every fd the daemon opens lazily is open before a
// test takes its free fds away. It returns the client and namespace of
// those sessions.
func startWarmedUp(t *testing.T, extra string) (*kvtierd, *client.Client, client.Namespace) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kvtierd.toml")
	if err := os.WriteFile(path, []byte(extra+"[host]\nslab_bytes = \"1MiB\"\nprefault = false\ncapacity = \"8MiB\"\n[nvme]\nenabled = false\n[ebpf]\nenabled = false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := client.Namespace{ModelID: "m", Layers: 1, KVHeads: 1, HeadDim: 1, DType: "fp16", TokensPerBlock: 1, TPSize: 1, BlockBytes: 4096}
	k := startKVTierd(t, path)
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: k.socket, DialTimeout: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for range 2 {
		s, err := c.Open(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
	}
	return k, c, ns
}
