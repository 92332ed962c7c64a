package shm

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func mustRegion(t *testing.T, size int64) *Region {
	t.Helper()
	r, err := CreateRegion("kvtier-test", size, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// dupFd returns a fresh fd for MapRegion, which takes ownership.
func dupFd(t *testing.T, fd int) int {
	t.Helper()
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func fdClosed(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return errors.Is(err, unix.EBADF)
}

func TestCreateRegionSealed(t *testing.T) {
	const size = 1 << 20
	r := mustRegion(t, size)
	if r.Size() != size || len(r.Bytes()) != size {
		t.Fatalf("size %d / %d, want %d", r.Size(), len(r.Bytes()), size)
	}
	seals, err := unix.FcntlInt(uintptr(r.Fd()), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []int{unix.F_SEAL_SHRINK, unix.F_SEAL_GROW, unix.F_SEAL_SEAL} {
		if seals&s == 0 {
			t.Errorf("seals %#x lack %#x", seals, s)
		}
	}
	if seals&RequiredSeals != RequiredSeals {
		t.Errorf("seals %#x lack RequiredSeals %#x", seals, RequiredSeals)
	}
	for _, n := range []int64{0, size / 2, size * 2} {
		if err := unix.Ftruncate(r.Fd(), n); !errors.Is(err, unix.EPERM) {
			t.Errorf("ftruncate to %d: %v, want EPERM", n, err)
		}
	}
	if _, err := unix.FcntlInt(uintptr(r.Fd()), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); !errors.Is(err, unix.EPERM) {
		t.Errorf("adding a seal after F_SEAL_SEAL: %v, want EPERM", err)
	}
	r.Bytes()[size-1] = 1 // writable
}

func TestCreateRegionInvalidSize(t *testing.T) {
	for _, n := range []int64{0, -1} {
		if r, err := CreateRegion("bad", n, false); err == nil {
			r.Close()
			t.Fatalf("CreateRegion(%d) succeeded", n)
		}
	}
}

func TestMapRegionShares(t *testing.T) {
	const size = 64 << 10
	r := mustRegion(t, size)
	for _, populate := range []bool{false, true} {
		m, err := MapRegion(dupFd(t, r.Fd()), size, populate)
		if err != nil {
			t.Fatalf("populate=%v: %v", populate, err)
		}
		r.Bytes()[100] = 42
		if m.Bytes()[100] != 42 {
			t.Fatal("write not visible through the peer mapping")
		}
		m.Bytes()[size-1] = 7
		if r.Bytes()[size-1] != 7 {
			t.Fatal("peer write not visible")
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
}

func TestMapRegionRejects(t *testing.T) {
	const size = 64 << 10
	memfd := func(t *testing.T, flags int, seals int) int {
		fd, err := unix.MemfdCreate("kvtier-test", unix.MFD_CLOEXEC|flags)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, size); err != nil {
			t.Fatal(err)
		}
		if seals != 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	tests := []struct {
		name string
		fd   func(t *testing.T) int
		size int64
		want string
	}{
		{"unsealed memfd", func(t *testing.T) int { return memfd(t, unix.MFD_ALLOW_SEALING, 0) }, size, "lack shrink/grow"},
		{"memfd without sealing", func(t *testing.T) int { return memfd(t, 0, 0) }, size, "lack shrink/grow"},
		{"only grow sealed", func(t *testing.T) int { return memfd(t, unix.MFD_ALLOW_SEALING, unix.F_SEAL_GROW) }, size, "lack shrink/grow"},
		{"only shrink sealed", func(t *testing.T) int { return memfd(t, unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK) }, size, "lack shrink/grow"},
		{"wrong size smaller", func(t *testing.T) int { return memfd(t, unix.MFD_ALLOW_SEALING, RequiredSeals) }, size / 2, "size 65536, expected 32768"},
		{"wrong size larger", func(t *testing.T) int { return memfd(t, unix.MFD_ALLOW_SEALING, RequiredSeals) }, size * 2, "expected 131072"},
		{"zero size", func(t *testing.T) int {
			fd, _ := unix.MemfdCreate("z", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
			unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, RequiredSeals)
			return fd
		}, 0, "size 0"},
		{"pipe", func(t *testing.T) int {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			unix.Close(p[1])
			return p[0]
		}, size, "get seals"},
		{"regular file", func(t *testing.T) int {
			path := filepath.Join(t.TempDir(), "f")
			if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
				t.Fatal(err)
			}
			fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			return fd
		}, size, ""}, // EINVAL from F_GET_SEALS, or no seals on tmpfs
		{"dev null", func(t *testing.T) int {
			fd, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			return fd
		}, size, ""},
		{"closed fd", func(t *testing.T) int {
			fd := memfd(t, unix.MFD_ALLOW_SEALING, RequiredSeals)
			unix.Close(fd)
			return fd
		}, size, "get seals"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fd := tc.fd(t)
			r, err := MapRegion(fd, tc.size, false)
			if err == nil {
				r.Close()
				t.Fatal("MapRegion accepted it")
			}
			if !errors.Is(err, ErrBadRegion) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrBadRegion containing %q", err, tc.want)
			}
			if !fdClosed(fd) {
				unix.Close(fd)
				t.Fatal("MapRegion left the fd open on error")
			}
		})
	}
}

func TestRegionPopulate(t *testing.T) {
	r := mustRegion(t, 1<<20)
	if err := r.Populate(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(r.Bytes()); i += 4096 {
		if r.Bytes()[i] != 0 {
			t.Fatal("populate changed contents")
		}
	}
	m, err := MapRegion(dupFd(t, r.Fd()), r.Size(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Populate(); err != nil {
		t.Fatal(err)
	}
}

func freeHugePages(t *testing.T) int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "HugePages_Free:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

func TestCreateRegionHugeFallback(t *testing.T) {
	const size = 4 << 20
	r, err := CreateRegion("kvtier-huge", size, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Huge != shmemTHP() {
		t.Fatalf("Huge = %v, shared memory THP %v", r.Huge, shmemTHP())
	}
	t.Logf("shmem THP %v, Huge = %v", shmemTHP(), r.Huge)
	if r.Size() != size {
		t.Fatalf("size %d", r.Size())
	}
	seals, err := unix.FcntlInt(uintptr(r.Fd()), unix.F_GET_SEALS, 0)
	if err != nil || seals&RequiredSeals != RequiredSeals {
		t.Fatalf("fallback region seals %#x, %v", seals, err)
	}
	r.Bytes()[0], r.Bytes()[size-1] = 1, 1
	// An odd size cannot be hugetlb-backed: it must fall back too.
	r2, err := CreateRegion("kvtier-huge-odd", 12345, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if r2.Size() != 12345 {
		t.Fatalf("size %d", r2.Size())
	}
}

func dupFdE(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// reserveHugePages makes n more hugetlb pages free for the test (root
// writes vm.nr_hugepages; restored after), or skips.
func reserveHugePages(t *testing.T, n int) {
	t.Helper()
	const knob = "/proc/sys/vm/nr_hugepages"
	b, err := os.ReadFile(knob)
	if err != nil {
		t.Skipf("no %s: %v", knob, err)
	}
	old := strings.TrimSpace(string(b))
	cur, _ := strconv.Atoi(old)
	if err := os.WriteFile(knob, []byte(strconv.Itoa(cur+n)), 0); err != nil {
		t.Skipf("cannot reserve hugepages (needs root): %v", err)
	}
	t.Cleanup(func() { os.WriteFile(knob, []byte(old), 0) })
	if freeHugePages(t) < 2 {
		t.Skip("the kernel gave no free hugepages")
	}
}

// touchFaults writes b[i] and reports whether that faulted (SIGBUS),
// recovering the fault instead of crashing the test binary.
func touchFaults(b []byte, i int) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if recover() != nil {
			faulted = true
		}
	}()
	b[i] = 1
	return false
}

// TestHugeRegionSurvivesPeerHolePunch: a peer holding a region's memfd (as
// every client holds the host arena's) punches a hole in it and takes every
// free hugetlb page. The owner's next touch of the hole must not fault. On
// a hugetlbfs region (what hugepages = true made while free hugepages
// existed) it was SIGBUS: any client could crash kvtierd.
func TestHugeRegionSurvivesPeerHolePunch(t *testing.T) {
	const hp = 2 << 20
	reserveHugePages(t, 4)
	r, err := CreateRegion("kvtier-huge-punch", 2*hp, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if IsHugeTLB(r.Fd()) {
		t.Fatal("a region shared with peers is hugetlbfs-backed")
	}
	mem := r.Bytes()
	mem[0], mem[hp] = 1, 1
	peer, err := unix.FcntlInt(uintptr(r.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(peer)
	if err := unix.Fallocate(peer, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, hp); err != nil {
		t.Fatalf("punch hole: %v", err)
	}
	grab, err := unix.MemfdCreate("grab", unix.MFD_CLOEXEC|unix.MFD_HUGETLB)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(grab)
	n := 0
	for ; n < 1<<14 && unix.Fallocate(grab, 0, int64(n)*hp, hp) == nil; n++ {
	}
	t.Logf("the peer took %d free hugepages after the punch", n)
	if touchFaults(mem, 0) {
		t.Fatal("the region's owner faulted (SIGBUS) writing the hole a peer punched")
	}
	if mem[hp] != 1 {
		t.Fatal("the page next to the hole changed")
	}
}
