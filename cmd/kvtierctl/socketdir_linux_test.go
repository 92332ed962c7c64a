package main

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
)

// TestDefaultSocketOfAnotherUserRefused: a non-root user's kvtierctl on the
// default socket (/tmp/kvtier-<uid>/kvtierd.sock without $XDG_RUNTIME_DIR
// or $KVTIER_SOCKET) must not talk to whatever another user put there. It
// named the default path to the client explicitly, which skips the
// client's directory check, and connected to another user's listener.
func TestDefaultSocketOfAnotherUserRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (acts as two users)")
	}
	const victim, attacker = 47021, 47022
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("KVTIER_SOCKET", "")
	for _, tt := range []struct {
		name        string
		owner       int
		mode        os.FileMode
		wantConnect bool
	}{
		{"another user's directory", attacker, 0o755, false},
		{"own directory", victim, 0o700, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := shm.DefaultRuntimeDir(victim, func(string) string { return "" })
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Skipf("cannot create %s for the test: %v", dir, err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			sock := filepath.Join(dir, shm.SocketName)
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(sock, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, tt.owner, tt.owner); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tt.mode); err != nil {
				t.Fatal(err)
			}
			var connected atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					c, err := ln.AcceptUnix()
					if err != nil {
						return
					}
					connected.Store(true)
					c.Close()
				}
			}()

			// The victim's kvtierctl, with the victim's euid on a thread of
			// its own (which ends with the goroutine).
			type result struct {
				stderr string
				err    error
			}
			rc := make(chan result, 1)
			go func() {
				runtime.LockOSThread()
				if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), victim, ^uintptr(0)); e != 0 {
					rc <- result{err: e}
					return
				}
				_, stderr, err := runCtx(context.Background(), "status", "--timeout", "2s")
				rc <- result{stderr, err}
			}()
			r := <-rc
			ln.Close()
			wg.Wait()
			if errors.Is(r.err, unix.EPERM) {
				t.Fatalf("setresuid: %v", r.err)
			}
			if r.err == nil {
				t.Fatal("status succeeded against a listener that hangs up")
			}
			if connected.Load() != tt.wantConnect {
				t.Fatalf("kvtierctl connected to %s: %v, want %v (status: %v)", sock, connected.Load(), tt.wantConnect, r.err)
			}
			if !tt.wantConnect && (!strings.Contains(r.err.Error(), "refusing to connect") || !strings.Contains(r.err.Error(), "for kvtierctl: $KVTIER_SOCKET")) {
				t.Errorf("status error %q does not say it refused the directory", r.err)
			}
		})
	}
}
