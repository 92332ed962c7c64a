package shm

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// PopulateRange faults in the pages of [off, off+n) for writing, so later
// copies into them neither allocate nor zero pages. Already-present pages
// are left as they are, so it is safe while peers use the region.
func (r *Region) PopulateRange(off, n int64) error {
	if off < 0 || n < 0 || off+n > int64(len(r.mem)) {
		return fmt.Errorf("populate [%d,+%d) outside region of %d bytes", off, n, len(r.mem))
	}
	err := unix.Madvise(r.mem[off:off+n], unix.MADV_POPULATE_WRITE)
	if errors.Is(err, unix.EINVAL) {
		return nil // kernel before 5.14: pages fault in on first use instead
	}
	if err != nil {
		return fmt.Errorf("populate region: %w", err)
	}
	return nil
}
