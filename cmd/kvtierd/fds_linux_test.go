package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
