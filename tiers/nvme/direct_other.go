//go:build !linux

package nvme

import "os"

func openSegmentFile(path string, create bool) (*os.File, bool, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flag, 0o600)
	return f, false, err
}

func dioAlign(string) (int, int) { return 4096, 4096 }

func fdatasync(f *os.File) error { return f.Sync() }

func writevAt(f *os.File, bufs [][]byte, off int64) error {
	for _, b := range bufs {
		if _, err := f.WriteAt(b, off); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}

func readvAt(f *os.File, bufs [][]byte, off int64) error {
	for _, b := range bufs {
		if _, err := f.ReadAt(b, off); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}
