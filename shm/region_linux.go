package shm

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// RequiredSeals are the seals every shared region carries before it is
// handed to a peer: the size can never change under a mapping (which would
// turn a peer's ftruncate into SIGBUS in the other process), and no further
// seals can be added.
const RequiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Region is a sealed memfd and its shared read-write mapping.
type Region struct {
	fd   int
	mem  []byte
	Huge bool // transparent huge pages asked for, and enabled for shared memory
}

// CreateRegion makes a sealed memfd of size bytes and maps it. With huge set
// it asks for transparent huge pages (MADV_HUGEPAGE), which the kernel uses
// where /sys/kernel/mm/transparent_hugepage/shmem_enabled allows them.
//
// It never uses MFD_HUGETLB: every peer holds the memfd read-write, and no
// seal short of F_SEAL_WRITE stops fallocate(FALLOC_FL_PUNCH_HOLE). On
// hugetlbfs a punched hole returns its pages to the pool, and once anyone
// takes them the owner's next touch of the hole is SIGBUS, fatal to a Go
// process. On shmem the touch allocates a fresh (zero) page.
func CreateRegion(name string, size int64, huge bool) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("create region %s: invalid size %d", name, size)
	}
	r, err := createRegion(name, size, 0)
	if err != nil || !huge {
		return r, err
	}
	r.Huge = unix.Madvise(r.mem, unix.MADV_HUGEPAGE) == nil && shmemTHP()
	return r, nil
}

// shmemTHP reports whether the kernel gives shared memory transparent huge
// pages when asked (mode always, within_size, advise or force).
func shmemTHP() bool {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	if err != nil {
		return false
	}
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return false
	}
	switch s[i+1 : j] {
	case "always", "within_size", "advise", "force":
		return true
	}
	return false
}

// IsHugeTLB reports whether fd is a hugetlbfs file, which must not be
// shared with peers (see CreateRegion).
func IsHugeTLB(fd int) bool {
	var st unix.Statfs_t
	return unix.Fstatfs(fd, &st) == nil && st.Type == unix.HUGETLBFS_MAGIC
}

func createRegion(name string, size int64, extra int) (*Region, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|extra)
	if err != nil {
		return nil, fmt.Errorf("memfd_create %s: %w", name, err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("size region %s to %d bytes: %w", name, size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, RequiredSeals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("seal region %s: %w", name, err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("map region %s: %w", name, err)
	}
	return &Region{fd: fd, mem: mem}, nil
}

// ErrBadRegion reports a region fd received from a peer that is not safe to
// map: wrong size, missing seals or not a memfd.
var ErrBadRegion = errors.New("unsafe shared region")

// MapRegion maps an fd received from a peer after checking that it is sealed
// against resizing and has exactly wantSize bytes. It takes ownership of fd
// (closing it on error).
func MapRegion(fd int, wantSize int64, populate bool) (*Region, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: get seals: %v", ErrBadRegion, err)
	}
	if seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: seals %#x lack shrink/grow", ErrBadRegion, seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: fstat: %v", ErrBadRegion, err)
	}
	if st.Size != wantSize || wantSize <= 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: size %d, expected %d", ErrBadRegion, st.Size, wantSize)
	}
	flags := unix.MAP_SHARED
	if populate {
		// Building the page tables now keeps minor faults (one per 4 KiB
		// page, as costly as the copy itself) off the data path.
		flags |= unix.MAP_POPULATE
	}
	mem, err := unix.Mmap(fd, 0, int(wantSize), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("map peer region: %w", err)
	}
	return &Region{fd: fd, mem: mem}, nil
}

// Bytes is the mapping. It is valid until Close.
func (r *Region) Bytes() []byte { return r.mem }

// Fd is the memfd, for passing to a peer with SCM_RIGHTS.
func (r *Region) Fd() int { return r.fd }

// Size is the region length in bytes.
func (r *Region) Size() int64 { return int64(len(r.mem)) }

// Populate faults every page in now (MADV_POPULATE_WRITE), so that the first
// copies into the region do not pay for page allocation.
func (r *Region) Populate() error {
	return r.PopulateRange(0, int64(len(r.mem)))
}

// Close unmaps the region and closes the fd. The memory lives on while a
// peer still maps it.
func (r *Region) Close() error {
	var errs []error
	if r.mem != nil {
		errs = append(errs, unix.Munmap(r.mem))
		r.mem = nil
	}
	if r.fd >= 0 {
		errs = append(errs, unix.Close(r.fd))
		r.fd = -1
	}
	return errors.Join(errs...)
}
