package shm

import (
	"fmt"
	"os"
	"path/filepath"
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
