//go:build !linux

package daemon

import "errors"

// readMemInfo has no portable source; the caller falls back to a small
// fixed size. kvtierd targets Linux (memfd, futex, SO_PEERCRED).
func readMemInfo() (memInfo, error) {
	return memInfo{}, errors.New("machine memory: not supported on this OS")
}
