//go:build linux

package nvme

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// openSegmentFile opens a segment file for direct I/O when the filesystem
// supports it (O_DIRECT; tmpfs and some others refuse it, then the file is
// opened buffered). It returns the file and whether it is direct.
func openSegmentFile(path string, create bool) (*os.File, bool, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flag|unix.O_DIRECT, 0o600)
	if err == nil {
		return f, true, nil
	}
	if create {
		os.Remove(path)
	}
	f, err = os.OpenFile(path, flag, 0o600)
	return f, false, err
}

// dioAlign returns the offset/length alignment and the memory alignment
// direct I/O needs on the filesystem of dir (statx STATX_DIOALIGN), or
// 4096, 4096 when the kernel does not say.
func dioAlign(dir string) (offAlign, memAlign int) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, 0, unix.STATX_DIOALIGN, &st); err == nil &&
		st.Mask&unix.STATX_DIOALIGN != 0 && st.Dio_offset_align > 0 && st.Dio_mem_align > 0 {
		return int(max(st.Dio_offset_align, 512)), int(max(st.Dio_mem_align, 512))
	}
	return 4096, 4096
}

func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

// iovMax is Linux's IOV_MAX: preadv/pwritev refuse more iovecs (EINVAL).
const iovMax = 1024

// writevAt writes bufs back to back at off with pwritev: one system call
// (one I/O) for a batch of records. Direct I/O needs every buffer aligned
// in memory and a multiple of the offset alignment; the caller checks.
func writevAt(f *os.File, bufs [][]byte, off int64) error {
	fd := int(f.Fd())
	for len(bufs) > 0 {
		n, err := unix.Pwritev(fd, bufs[:min(len(bufs), iovMax)], off)
		if err != nil {
			return &os.PathError{Op: "pwritev", Path: f.Name(), Err: err}
		}
		if n == 0 {
			return &os.PathError{Op: "pwritev", Path: f.Name(), Err: unix.EIO}
		}
		off += int64(n)
		bufs = advance(bufs, n) // a short write: skip what was written
	}
	return nil
}

// advance drops the first n bytes of bufs (a short transfer's part done).
// It may reslice bufs[0] in place: the bytes are not touched.
func advance(bufs [][]byte, n int) [][]byte {
	for n > 0 && len(bufs) > 0 {
		if n < len(bufs[0]) {
			bufs[0] = bufs[0][n:]
			n = 0
		} else {
			n -= len(bufs[0])
			bufs = bufs[1:]
		}
	}
	return bufs
}

// readvAt fills bufs back to back from off with preadv: one system call
// (one I/O) for records adjacent on disk. A file that ends early is an
// error.
func readvAt(f *os.File, bufs [][]byte, off int64) error {
	fd := int(f.Fd())
	for len(bufs) > 0 {
		n, err := unix.Preadv(fd, bufs[:min(len(bufs), iovMax)], off)
		if err != nil {
			return &os.PathError{Op: "preadv", Path: f.Name(), Err: err}
		}
		if n == 0 {
			return &os.PathError{Op: "preadv", Path: f.Name(), Err: io.ErrUnexpectedEOF}
		}
		off += int64(n)
		bufs = advance(bufs, n)
	}
	return nil
}
