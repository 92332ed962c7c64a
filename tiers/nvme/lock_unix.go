//go:build unix

package nvme

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// dirLock is an exclusive flock on a file beside the store directory. It
// lives outside the directory so that moving a corrupt directory aside
// never moves the lock, and so that we only move a directory aside that no
// other kvtier process holds.
type dirLock struct{ f *os.File }

func lockDir(path string) (*dirLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %s is held by another process: %w", ErrLocked, path, err)
	}
	return &dirLock{f: f}, nil
}

func (l *dirLock) release() error {
	if l == nil || l.f == nil {
		return nil
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	err := l.f.Close()
	l.f = nil
	return err
}
