package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// SocketName is the control socket's file name inside the runtime dir.
const SocketName = "kvtierd.sock"

// DefaultRuntimeDir is where the daemon puts its socket unless configured
// otherwise, and so where clients look for it: /run/kvtier for root,
// $XDG_RUNTIME_DIR/kvtier for a user, /tmp/kvtier-<uid> as the last resort.
// Daemon and client share this rule so that both work with no flags.
func DefaultRuntimeDir(euid int, getenv func(string) string) string {
	if euid == 0 {
		return "/run/kvtier"
	}
	// XDG says relative paths in this variable must be ignored.
	if d := getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(d) {
		return filepath.Join(d, "kvtier")
	}
	return fmt.Sprintf("/tmp/kvtier-%d", euid)
}

// DefaultSocket is the control socket path clients use by default;
// $KVTIER_SOCKET overrides it.
func DefaultSocket() string {
	if p := os.Getenv("KVTIER_SOCKET"); p != "" {
		return p
	}
	return filepath.Join(DefaultRuntimeDir(os.Geteuid(), os.Getenv), SocketName)
}

// ErrSocketDirUnsafe: a socket directory another user controls. Its owner
// (or anyone, if everyone may write it without the sticky bit) could put a
// socket of their own there: a daemon would be replaced, a client would
// talk to an impostor. The default for a user without $XDG_RUNTIME_DIR,
// /tmp/kvtier-<uid>, is a name any local user can create first.
var ErrSocketDirUnsafe = errors.New("socket dir controlled by another user")

// CheckSocketDir applies the rule daemon and client share to the directory
// of a control socket: it, and a symlink at its path, must be owned by euid
// or root, and it must not be writable by everyone unless sticky (/tmp).
// A refusal wraps ErrSocketDirUnsafe and says why.
func CheckSocketDir(dir string, euid int) error {
	notOurs := func(fi os.FileInfo) (uint32, bool) {
		st, ok := fi.Sys().(*syscall.Stat_t)
		return st.Uid, ok && int(st.Uid) != euid && st.Uid != 0
	}
	// A symlink at the path is checked as well as its target: another
	// user's link to a directory that passes (/tmp: root's, sticky) would
	// otherwise put the socket where that user chose.
	if li, err := os.Lstat(dir); err == nil && li.Mode()&os.ModeSymlink != 0 {
		if uid, bad := notOurs(li); bad {
			return fmt.Errorf("%w: %s is a symlink owned by uid %d, not by uid %d or root", ErrSocketDirUnsafe, dir, uid, euid)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("socket dir %s: %w", dir, err)
	}
	if uid, bad := notOurs(fi); bad {
		return fmt.Errorf("%w: %s is owned by uid %d, not by uid %d or root", ErrSocketDirUnsafe, dir, uid, euid)
	}
	if fi.Mode().Perm()&0o002 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return fmt.Errorf("%w: %s is writable by everyone (mode %v) without the sticky bit", ErrSocketDirUnsafe, dir, fi.Mode().Perm())
	}
	return nil
}
