//go:build unix

package nvme

import (
	"io/fs"
	"syscall"
)

// allocated returns the bytes the file occupies on disk. Badger's value-log
// and memtable files are preallocated sparse (truncated to twice their
// target size and mmapped), so the apparent size overstates usage; the
// allocated block count is what a disk budget is about.
func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return fi.Size()
}

// fsAvail returns the bytes available to unprivileged writers on dir's
// filesystem.
func fsAvail(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
