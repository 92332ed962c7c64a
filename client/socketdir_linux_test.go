package client_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// TestDefaultSocketOfAnotherUserRefused: without $XDG_RUNTIME_DIR and
// $KVTIER_SOCKET a user's client looks for its daemon in /tmp/kvtier-<uid>,
// a name any local user can create first (the daemon itself refuses to
// serve from such a directory). The client connected to whatever listened
// there: another user's fake daemon got its Hello, and would have been sent
// the blocks it puts and answered its reads. The client must not connect
// through a default socket directory owned by another user, nor through
// another user's symlink there (to /tmp, say, which passes the check, where
// that user's socket waits).
func TestDefaultSocketOfAnotherUserRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (acts as two users)")
	}
	const victim, attacker = 47011, 47012
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("KVTIER_SOCKET", "")
	for _, tt := range []struct {
		name        string
		owner       int
		mode        os.FileMode
		wantConnect bool
		// linkBy, if set, owns a symlink at the default path to the
		// directory (root's, sticky and writable by all, like /tmp).
		linkBy int
	}{
		{"another user's directory", attacker, 0o755, false, 0},
		{"own directory writable by everyone", victim, 0o777, false, 0},
		{"own directory", victim, 0o750, true, 0},
		{"another user's symlink to a sticky directory", 0, 0o777 | os.ModeSticky, false, attacker},
		{"own symlink to an own directory", victim, 0o750, true, victim},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := shm.DefaultRuntimeDir(victim, func(string) string { return "" })
			real := dir
			if tt.linkBy != 0 {
				real = dir + ".target"
			}
			if err := os.Mkdir(real, 0o700); err != nil {
				t.Skipf("cannot create %s for the test: %v", real, err)
			}
			t.Cleanup(func() { os.RemoveAll(real) })
			if tt.linkBy != 0 {
				if err := os.Symlink(real, dir); err != nil {
					t.Skipf("cannot create %s for the test: %v", dir, err)
				}
				t.Cleanup(func() { os.Remove(dir) })
				if err := os.Lchown(dir, tt.linkBy, tt.linkBy); err != nil {
					t.Fatal(err)
				}
			}
			sock := filepath.Join(real, shm.SocketName)
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(sock, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(real, tt.owner, tt.owner); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(real, tt.mode); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var connected bool
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					c, err := ln.AcceptUnix()
					if err != nil {
						return
					}
					connected = true
					c.Close()
				}
			}()

			// The victim's client, with the victim's euid on a thread of
			// its own (which ends with the goroutine).
			errc := make(chan error, 1)
			go func() {
				runtime.LockOSThread()
				if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), victim, ^uintptr(0)); e != 0 {
					errc <- e
					return
				}
				c, err := client.Dial(context.Background(), client.Options{DialTimeout: 2 * time.Second})
				if err == nil {
					c.Close()
					err = errors.New("dial succeeded")
				}
				errc <- err
			}()
			derr := <-errc
			ln.Close()
			wg.Wait()
			if errors.Is(derr, unix.EPERM) {
				t.Fatalf("setresuid: %v", derr)
			}
			if connected != tt.wantConnect {
				t.Fatalf("the client connected to %s: %v, want %v (dial: %v)", sock, connected, tt.wantConnect, derr)
			}
		})
	}
}
