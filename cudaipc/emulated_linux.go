//go:build !cuda

package cudaipc

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"
)

// EnvEmulatedGPUs configures the emulated devices of the default (non-cuda)
// build: "N" or "N:SIZE", e.g. "2:1GiB" for two devices of 1 GiB each (SIZE
// defaults to 1GiB). Unset, empty or "0" means no GPU, so the GPU tier is off
// by default.
const EnvEmulatedGPUs = "KVTIER_EMULATED_GPUS"

const emuDefaultSize = 1 << 30

// Emulated reports whether this build emulates the GPUs (the default build)
// instead of driving CUDA (the cuda build tag).
const Emulated = true

// emuGPU is the process-wide state of one emulated GPU, shared by every
// Device handle on it (as a real GPU is shared by every context).
type emuGPU struct {
	ordinal int
	uuid    UUID
	total   int64

	mu      sync.Mutex
	used    int64                   // bytes allocated by this process
	regions map[*emuRegion]struct{} // arenas and mappings live in this process
}

var emu struct {
	mu       sync.Mutex
	gpus     map[[2]int64]*emuGPU // (ordinal, size) → state
	hostRegs map[uintptr]int      // pinned host ranges: base → length
}

// Devices lists the emulated GPUs configured by KVTIER_EMULATED_GPUS. With
// none configured it fails with ErrNoDevice. Each returned Device must be
// closed.
func Devices() ([]Device, error) {
	n, size, err := parseEmulated(os.Getenv(EnvEmulatedGPUs))
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("emulated devices (%s unset): %w", EnvEmulatedGPUs, ErrNoDevice)
	}
	emu.mu.Lock()
	defer emu.mu.Unlock()
	if emu.gpus == nil {
		emu.gpus = make(map[[2]int64]*emuGPU)
	}
	devs := make([]Device, n)
	for i := range n {
		key := [2]int64{int64(i), size}
		g := emu.gpus[key]
		if g == nil {
			g = &emuGPU{ordinal: i, uuid: emulatedUUID(i), total: size, regions: make(map[*emuRegion]struct{})}
			emu.gpus[key] = g
		}
		devs[i] = &emuDevice{g: g}
	}
	return devs, nil
}

func parseEmulated(spec string) (n int, size int64, err error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return 0, 0, nil
	}
	count, sz, hasSize := strings.Cut(spec, ":")
	n, err = strconv.Atoi(strings.TrimSpace(count))
	if err != nil || n < 0 || n > 64 {
		return 0, 0, fmt.Errorf("%s=%q: device count must be 0..64", EnvEmulatedGPUs, spec)
	}
	size = emuDefaultSize
	if hasSize {
		b, err := humanize.ParseBytes(strings.TrimSpace(sz))
		if err != nil || b == 0 || b > 1<<46 {
			return 0, 0, fmt.Errorf("%s=%q: bad device size", EnvEmulatedGPUs, spec)
		}
		size = int64(b)
	}
	return n, size, nil
}

func emulatedUUID(ordinal int) UUID {
	sum := sha256.Sum256([]byte("kvtier emulated GPU " + strconv.Itoa(ordinal)))
	var u UUID
	copy(u[:], sum[:])
	return u
}

// emuRegion is device memory: a sealed memfd mapping, either allocated here
// (an arena, fd kept open so that peers can reach it) or opened from a peer's
// handle (a mapping, fd closed once mapped).
type emuRegion struct {
	g     *emuGPU
	mem   []byte
	fd    int // -1 for a mapping
	name  string
	nonce [16]byte
	inUse sync.WaitGroup // copies queued on the region; guarded by g.mu for Add
}

func (r *emuRegion) base() DevicePtr {
	return DevicePtr(uintptr(unsafe.Pointer(unsafe.SliceData(r.mem))))
}

// resolve finds the n bytes at p in one live region of g and takes a use on
// that region; the caller calls done (once the copy ran).
func (g *emuGPU) resolve(p DevicePtr, n int64) (b []byte, done func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for r := range g.regions {
		base := r.base()
		if p < base || p >= base+DevicePtr(len(r.mem)) {
			continue
		}
		off := int64(p - base)
		if n > int64(len(r.mem))-off {
			return nil, nil, fmt.Errorf("%w: %d bytes at %#x run past the end of a %d-byte region", ErrInvalidValue, n, uintptr(p), len(r.mem))
		}
		r.inUse.Add(1)
		return r.mem[off : off+n], r.inUse.Done, nil
	}
	return nil, nil, fmt.Errorf("%w: %#x is not memory of emulated GPU %d", ErrInvalidValue, uintptr(p), g.ordinal)
}

// remove unregisters r (no new copies can reach it), waits for the copies
// queued on it and unmaps it.
func (g *emuGPU) remove(r *emuRegion) error {
	g.mu.Lock()
	if _, ok := g.regions[r]; !ok {
		g.mu.Unlock()
		return ErrClosed
	}
	delete(g.regions, r)
	if r.fd >= 0 {
		g.used -= int64(len(r.mem))
	}
	g.mu.Unlock()
	r.inUse.Wait()
	var errs []error
	errs = append(errs, unix.Munmap(r.mem))
	if r.fd >= 0 {
		errs = append(errs, unix.Close(r.fd))
	}
	return errors.Join(errs...)
}

type emuDevice struct {
	g      *emuGPU
	closed atomic.Bool
}

func (d *emuDevice) check() error {
	if d.closed.Load() {
		return fmt.Errorf("emulated GPU %d: %w", d.g.ordinal, ErrClosed)
	}
	return nil
}

func (d *emuDevice) Info() Info {
	return Info{Ordinal: d.g.ordinal, UUID: d.g.uuid, Name: fmt.Sprintf("kvtier emulated GPU %d", d.g.ordinal), TotalMem: d.g.total}
}

func (d *emuDevice) MemInfo() (free, total int64, err error) {
	if err := d.check(); err != nil {
		return 0, 0, err
	}
	d.g.mu.Lock()
	defer d.g.mu.Unlock()
	return d.g.total - d.g.used, d.g.total, nil
}

func (d *emuDevice) Close() error {
	if d.closed.Swap(true) {
		return fmt.Errorf("emulated GPU %d: %w", d.g.ordinal, ErrClosed)
	}
	return nil
}

// Alloc makes a sealed memfd of size bytes: device memory that a peer process
// maps through the arena's IPC handle.
func (d *emuDevice) Alloc(size int64) (Arena, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	g := d.g
	if size <= 0 || size > 1<<46 {
		return nil, fmt.Errorf("alloc %d bytes on emulated GPU %d: %w", size, g.ordinal, ErrInvalidValue)
	}
	g.mu.Lock()
	if g.used+size > g.total {
		free := g.total - g.used
		g.mu.Unlock()
		return nil, fmt.Errorf("alloc %d bytes on emulated GPU %d (%d free): %w", size, g.ordinal, free, ErrOutOfMemory)
	}
	g.used += size // reserved; released below on failure
	g.mu.Unlock()

	r, err := newEmuRegion(g, size)
	if err != nil {
		g.mu.Lock()
		g.used -= size
		g.mu.Unlock()
		return nil, fmt.Errorf("alloc %d bytes on emulated GPU %d: %w", size, g.ordinal, err)
	}
	g.mu.Lock()
	g.regions[r] = struct{}{}
	g.mu.Unlock()
	return &emuArena{r: r}, nil
}

func newEmuRegion(g *emuGPU, size int64) (*emuRegion, error) {
	r := &emuRegion{g: g}
	if _, err := rand.Read(r.nonce[:]); err != nil {
		return nil, err
	}
	r.name = emuMemfdName(g.ordinal, r.nonce)
	fd, err := unix.MemfdCreate(r.name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	const seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("seal: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap: %w", err)
	}
	r.fd, r.mem = fd, mem
	return r, nil
}

// emuMemfdName carries the handle's nonce, so that an importer can tell the
// exporter's memfd from whatever reuses its fd number (or its pid) later.
func emuMemfdName(ordinal int, nonce [16]byte) string {
	return fmt.Sprintf("kvtier-emugpu%d-%s", ordinal, hex.EncodeToString(nonce[:]))
}

type emuArena struct {
	r     *emuRegion
	freed atomic.Bool
}

func (a *emuArena) Ptr() DevicePtr { return a.r.base() }
func (a *emuArena) Size() int64    { return int64(len(a.r.mem)) }

func (a *emuArena) alive() bool {
	a.r.g.mu.Lock()
	defer a.r.g.mu.Unlock()
	_, ok := a.r.g.regions[a.r]
	return ok
}

// Emulated handle layout (little endian); the rest is zero.
const (
	emuMagic     = "KVEMGPU1"
	emuOffPid    = 8  // uint32
	emuOffFd     = 12 // uint32
	emuOffSize   = 16 // uint64
	emuOffOrd    = 24 // uint32
	emuOffNonce  = 28 // [16]byte
	emuOffUUID   = 44 // [16]byte
	emuHandleEnd = 60
)

func (a *emuArena) IPCHandle() (IPCHandle, error) {
	var h IPCHandle
	if !a.alive() {
		return h, fmt.Errorf("export arena: %w", ErrClosed)
	}
	return encodeEmuHandle(emuHandle{pid: os.Getpid(), fd: a.r.fd, ordinal: a.r.g.ordinal,
		size: int64(len(a.r.mem)), nonce: a.r.nonce, uuid: a.r.g.uuid}), nil
}

// encodeEmuHandle is the one writer of the handle layout decodeEmuHandle
// reads.
func encodeEmuHandle(e emuHandle) IPCHandle {
	var h IPCHandle
	copy(h[:], emuMagic)
	binary.LittleEndian.PutUint32(h[emuOffPid:], uint32(e.pid))
	binary.LittleEndian.PutUint32(h[emuOffFd:], uint32(e.fd))
	binary.LittleEndian.PutUint64(h[emuOffSize:], uint64(e.size))
	binary.LittleEndian.PutUint32(h[emuOffOrd:], uint32(e.ordinal))
	copy(h[emuOffNonce:], e.nonce[:])
	copy(h[emuOffUUID:], e.uuid[:])
	return h
}

func (a *emuArena) Free() error {
	if a.freed.Swap(true) {
		return fmt.Errorf("free arena: %w", ErrClosed)
	}
	if err := a.r.g.remove(a.r); err != nil {
		return fmt.Errorf("free arena: %w", err)
	}
	return nil
}

type emuHandle struct {
	pid, fd, ordinal int
	size             int64
	nonce            [16]byte
	uuid             UUID
}

func decodeEmuHandle(h IPCHandle) (emuHandle, error) {
	var e emuHandle
	if string(h[:len(emuMagic)]) != emuMagic {
		return e, fmt.Errorf("%w: not an emulated-GPU handle", ErrInvalidHandle)
	}
	for _, b := range h[emuHandleEnd:] {
		if b != 0 {
			return e, fmt.Errorf("%w: trailing bytes", ErrInvalidHandle)
		}
	}
	e.pid = int(binary.LittleEndian.Uint32(h[emuOffPid:]))
	e.fd = int(binary.LittleEndian.Uint32(h[emuOffFd:]))
	size := binary.LittleEndian.Uint64(h[emuOffSize:])
	e.ordinal = int(binary.LittleEndian.Uint32(h[emuOffOrd:]))
	copy(e.nonce[:], h[emuOffNonce:])
	copy(e.uuid[:], h[emuOffUUID:])
	if e.pid <= 0 || e.pid > 1<<22 || e.fd < 0 || e.fd > 1<<20 || e.ordinal > 64 || size == 0 || size > 1<<46 {
		return e, fmt.Errorf("%w: fields out of range", ErrInvalidHandle)
	}
	e.size = int64(size)
	return e, nil
}

// OpenIPC maps the exporter's memfd through /proc/<pid>/fd/<fd>, which needs
// the same access as reading the exporter's /proc entries (same user or
// CAP_SYS_PTRACE) and the same pid namespace. Unlike CUDA the mapping stays
// valid after the exporter exits; do not rely on it.
func (d *emuDevice) OpenIPC(h IPCHandle) (Mapping, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	e, err := decodeEmuHandle(h)
	if err != nil {
		return nil, fmt.Errorf("open IPC handle: %w", err)
	}
	if e.pid == os.Getpid() {
		return nil, fmt.Errorf("open IPC handle of GPU %d arena: %w", e.ordinal, ErrSameProcess)
	}
	if e.uuid != d.g.uuid {
		return nil, fmt.Errorf("open IPC handle on %s: %w: exported by device %s", d.g.uuid, ErrInvalidHandle, e.uuid)
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", e.pid, e.fd)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("open IPC handle: %w: arena freed or exporter %d exited", ErrInvalidHandle, e.pid)
		}
		return nil, fmt.Errorf("open IPC handle: open %s: %w", path, err)
	}
	// Check the fd we hold, not the path: the exporter may free and reuse
	// the fd number at any time.
	want := "/memfd:" + emuMemfdName(e.ordinal, e.nonce) + " (deleted)"
	if got, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err != nil || got != want {
		unix.Close(fd)
		return nil, fmt.Errorf("open IPC handle: %w: arena freed (fd %d of %d is now %q)", ErrInvalidHandle, e.fd, e.pid, got)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	var st unix.Stat_t
	if err == nil {
		err = unix.Fstat(fd, &st)
	}
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW || st.Size != e.size {
		unix.Close(fd)
		return nil, fmt.Errorf("open IPC handle: %w: region not sealed or size %d != %d (%v)", ErrInvalidHandle, st.Size, e.size, err)
	}
	mem, err := unix.Mmap(fd, 0, int(e.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		return nil, fmt.Errorf("open IPC handle: mmap %d bytes: %w", e.size, err)
	}
	r := &emuRegion{g: d.g, mem: mem, fd: -1, nonce: e.nonce}
	d.g.mu.Lock()
	d.g.regions[r] = struct{}{}
	d.g.mu.Unlock()
	return &emuMapping{r: r}, nil
}

type emuMapping struct {
	r      *emuRegion
	closed atomic.Bool
}

func (m *emuMapping) Ptr() DevicePtr { return m.r.base() }
func (m *emuMapping) Size() int64    { return int64(len(m.r.mem)) }

func (m *emuMapping) Close() error {
	if m.closed.Swap(true) {
		return fmt.Errorf("close IPC mapping: %w", ErrClosed)
	}
	if err := m.r.g.remove(m.r); err != nil {
		return fmt.Errorf("close IPC mapping: %w", err)
	}
	return nil
}

func hostBase(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// RegisterHost records b as pinned; like cuMemHostRegister it refuses empty
// and overlapping ranges. (Nothing is locked: the emulated copies do not care.)
func (d *emuDevice) RegisterHost(b []byte) error {
	if err := d.check(); err != nil {
		return err
	}
	if len(b) == 0 {
		return fmt.Errorf("register host memory: %w: empty range", ErrInvalidValue)
	}
	base := hostBase(b)
	emu.mu.Lock()
	defer emu.mu.Unlock()
	if emu.hostRegs == nil {
		emu.hostRegs = make(map[uintptr]int)
	}
	for rb, rl := range emu.hostRegs {
		if base < rb+uintptr(rl) && rb < base+uintptr(len(b)) {
			return fmt.Errorf("register host memory %#x+%d: %w: overlaps a registered range", base, len(b), ErrInvalidValue)
		}
	}
	emu.hostRegs[base] = len(b)
	return nil
}

func (d *emuDevice) UnregisterHost(b []byte) error {
	if err := d.check(); err != nil {
		return err
	}
	base := hostBase(b)
	emu.mu.Lock()
	defer emu.mu.Unlock()
	if _, ok := emu.hostRegs[base]; !ok || len(b) == 0 {
		return fmt.Errorf("unregister host memory %#x: %w: not registered", base, ErrInvalidValue)
	}
	delete(emu.hostRegs, base)
	return nil
}

// emuStream runs its copies in order on one goroutine, so that a caller who
// reads a destination before synchronizing is caught by the race detector,
// as it would read stale bytes on a real GPU.
type emuStream struct {
	g      *emuGPU
	mu     sync.RWMutex // excludes Close from sends
	closed bool
	ops    chan func()
	exited chan struct{}
}

func (d *emuDevice) NewStream() (Stream, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	s := &emuStream{g: d.g, ops: make(chan func(), 256), exited: make(chan struct{})}
	go s.run()
	return s, nil
}

func (s *emuStream) run() {
	defer close(s.exited)
	for op := range s.ops {
		op()
	}
}

func (s *emuStream) enqueue(op func()) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return fmt.Errorf("stream: %w", ErrClosed)
	}
	s.ops <- op
	return nil
}

// marker queues a point in the stream and returns the channel closed when
// it is reached.
func (s *emuStream) marker() (<-chan struct{}, error) {
	c := make(chan struct{})
	if err := s.enqueue(func() { close(c) }); err != nil {
		return nil, err
	}
	return c, nil
}

// HoldStream queues a gate on s: the copies and event records queued after
// it wait until release is called (release is idempotent and never blocks).
// It models a stream busy with the caller's own kernels, so that tests can
// show that work tied to an event waits for the stream and not for the call
// that queued it. Release every hold before closing the stream. The emulated
// device only; the cuda build returns ErrNotSupported.
func HoldStream(s Stream) (release func(), err error) {
	es, ok := s.(*emuStream)
	if !ok || es == nil {
		return nil, fmt.Errorf("hold stream: %w: %T is not an emulated stream", ErrInvalidValue, s)
	}
	gate := make(chan struct{})
	if err := es.enqueue(func() { <-gate }); err != nil {
		return nil, fmt.Errorf("hold stream: %w", err)
	}
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }, nil
}

func (s *emuStream) Synchronize() error {
	c, err := s.marker()
	if err != nil {
		return err
	}
	<-c
	return nil
}

func (s *emuStream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("stream: %w", ErrClosed)
	}
	s.closed = true
	close(s.ops)
	s.mu.Unlock()
	<-s.exited
	return nil
}

func (d *emuDevice) stream(s Stream) (*emuStream, error) {
	es, ok := s.(*emuStream)
	if !ok || es == nil {
		return nil, fmt.Errorf("%w: stream %T is not an emulated stream", ErrInvalidValue, s)
	}
	if es.g != d.g {
		return nil, fmt.Errorf("%w: stream of GPU %d used on GPU %d", ErrInvalidValue, es.g.ordinal, d.g.ordinal)
	}
	return es, nil
}

type emuEvent struct {
	g      *emuGPU
	mu     sync.Mutex
	done   <-chan struct{} // nil: nothing recorded (complete)
	closed bool
}

func (d *emuDevice) NewEvent() (Event, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	return &emuEvent{g: d.g}, nil
}

func (e *emuEvent) Record(s Stream) error {
	es, ok := s.(*emuStream)
	if !ok || es == nil || es.g != e.g {
		return fmt.Errorf("record event: %w: stream %T of another device or implementation", ErrInvalidValue, s)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("record event: %w", ErrClosed)
	}
	c, err := es.marker()
	if err != nil {
		return fmt.Errorf("record event: %w", err)
	}
	e.done = c
	return nil
}

func (e *emuEvent) current() (<-chan struct{}, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("event: %w", ErrClosed)
	}
	return e.done, nil
}

func (e *emuEvent) Query() (bool, error) {
	c, err := e.current()
	if err != nil || c == nil {
		return err == nil, err
	}
	select {
	case <-c:
		return true, nil
	default:
		return false, nil
	}
}

func (e *emuEvent) Synchronize() error {
	c, err := e.current()
	if err != nil || c == nil {
		return err
	}
	<-c
	return nil
}

func (e *emuEvent) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("event: %w", ErrClosed)
	}
	e.closed = true
	return nil
}

// The copies check their arguments when queued and hold a use on the device
// regions they touch until they ran, so that Free and Close wait for them.

func (d *emuDevice) CopyHtoDAsync(dst DevicePtr, src []byte, s Stream) error {
	if err := d.check(); err != nil {
		return err
	}
	es, err := d.stream(s)
	if err != nil {
		return fmt.Errorf("copy H2D: %w", err)
	}
	db, done, err := d.g.resolve(dst, int64(len(src)))
	if err != nil {
		return fmt.Errorf("copy H2D of %d bytes: %w", len(src), err)
	}
	if err := es.enqueue(func() { copy(db, src); done() }); err != nil {
		done()
		return fmt.Errorf("copy H2D: %w", err)
	}
	return nil
}

func (d *emuDevice) CopyDtoHAsync(dst []byte, src DevicePtr, s Stream) error {
	if err := d.check(); err != nil {
		return err
	}
	es, err := d.stream(s)
	if err != nil {
		return fmt.Errorf("copy D2H: %w", err)
	}
	sb, done, err := d.g.resolve(src, int64(len(dst)))
	if err != nil {
		return fmt.Errorf("copy D2H of %d bytes: %w", len(dst), err)
	}
	if err := es.enqueue(func() { copy(dst, sb); done() }); err != nil {
		done()
		return fmt.Errorf("copy D2H: %w", err)
	}
	return nil
}

func (d *emuDevice) CopyDtoDAsync(dst, src DevicePtr, n int64, s Stream) error {
	return d.copyD2D("copy D2D", d.g, dst, src, n, s)
}

func (d *emuDevice) copyD2D(what string, dstG *emuGPU, dst, src DevicePtr, n int64, s Stream) error {
	if err := d.check(); err != nil {
		return err
	}
	es, err := d.stream(s)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n < 0 {
		return fmt.Errorf("%s: %w: negative length %d", what, ErrInvalidValue, n)
	}
	sb, sdone, err := d.g.resolve(src, n)
	if err != nil {
		return fmt.Errorf("%s of %d bytes: source: %w", what, n, err)
	}
	db, ddone, err := dstG.resolve(dst, n)
	if err != nil {
		sdone()
		return fmt.Errorf("%s of %d bytes: destination: %w", what, n, err)
	}
	if err := es.enqueue(func() { copy(db, sb); ddone(); sdone() }); err != nil {
		ddone()
		sdone()
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func (d *emuDevice) CanAccessPeer(peer Device) (bool, error) {
	if err := d.check(); err != nil {
		return false, err
	}
	p, ok := peer.(*emuDevice)
	if !ok || p == nil {
		return false, fmt.Errorf("can access peer: %w: %T is not an emulated device", ErrInvalidValue, peer)
	}
	return p.g != d.g, nil
}

func (d *emuDevice) CopyPeerAsync(dst DevicePtr, dstDev Device, src DevicePtr, n int64, s Stream) error {
	p, ok := dstDev.(*emuDevice)
	if !ok || p == nil {
		return fmt.Errorf("copy peer: %w: %T is not an emulated device", ErrInvalidValue, dstDev)
	}
	if err := p.check(); err != nil {
		return err
	}
	return d.copyD2D(fmt.Sprintf("copy peer GPU %d → GPU %d", d.g.ordinal, p.g.ordinal), p.g, dst, src, n, s)
}
