//go:build cuda

package cudaipc

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"gorgonia.org/cu"
)

// Emulated reports whether this build emulates the GPUs (the default build)
// instead of driving CUDA (the cuda build tag).
const Emulated = false

// EnvEmulatedGPUs is ignored by the cuda build; it is defined so that code
// naming it builds with either tag.
const EnvEmulatedGPUs = "KVTIER_EMULATED_GPUS"

// exported holds the handles this process exported: CUDA refuses to open them
// here, and we say so with ErrSameProcess instead of a driver error.
var exported struct {
	mu sync.Mutex
	m  map[IPCHandle]struct{}
}

// HoldStream is a test hook of the emulated device (see its doc there); a
// real stream cannot be gated from the host without a kernel or a host
// callback, so the cuda build refuses.
func HoldStream(s Stream) (release func(), err error) {
	return nil, fmt.Errorf("hold stream: %w", ErrNotSupported)
}

// Devices lists the GPUs visible to this process (CUDA_VISIBLE_DEVICES
// applies), each holding a reference on its primary context until Close.
// With no GPU it fails with ErrNoDevice.
func Devices() ([]Device, error) {
	if err := shimInitError(); err != nil {
		// No driver, no device node, a driver not ready yet at boot: the
		// process runs on without GPUs (see cuinit_cuda.c).
		var ce *cuError
		if errors.As(err, &ce) && ce.code == cuErrNoDevice {
			return nil, fmt.Errorf("cuda: %w: %w", ErrNoDevice, err)
		}
		return nil, fmt.Errorf("cuda: driver not initialised: %w", err)
	}
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("cuDeviceGetCount: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("cuda: %w", ErrNoDevice)
	}
	devs := make([]Device, 0, n)
	fail := func(err error) ([]Device, error) {
		for _, d := range devs {
			d.Close()
		}
		return nil, err
	}
	for i := range n {
		dev, err := cu.GetDevice(i)
		if err != nil {
			return fail(fmt.Errorf("cuDeviceGet(%d): %w", i, err))
		}
		name, err := dev.Name()
		if err != nil {
			return fail(fmt.Errorf("GPU %d name: %w", i, err))
		}
		uuid, err := shimUUID(int(dev))
		if err != nil {
			return fail(fmt.Errorf("GPU %d: %w", i, err))
		}
		total, err := dev.TotalMem()
		if err != nil {
			return fail(fmt.Errorf("GPU %d total memory: %w", i, err))
		}
		ctx, err := dev.RetainPrimaryCtx()
		if err != nil {
			return fail(fmt.Errorf("GPU %d primary context: %w", i, err))
		}
		devs = append(devs, &cudaDevice{dev: dev, ctx: ctx,
			info: Info{Ordinal: i, UUID: uuid, Name: name, TotalMem: total}})
	}
	return devs, nil
}

type cudaDevice struct {
	dev    cu.Device
	ctx    cu.CUContext // primary context, retained
	info   Info
	closed atomic.Bool
}

// do runs fn on a locked OS thread with the device's context current: CUDA
// contexts are per thread and goroutines move between threads. Everything
// that touches the driver, closing included, goes through here.
func (d *cudaDevice) do(fn func() error) error {
	if d.closed.Load() {
		return fmt.Errorf("GPU %d: %w", d.info.Ordinal, ErrClosed)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.PushCurrentCtx(d.ctx); err != nil {
		return fmt.Errorf("GPU %d: cuCtxPushCurrent: %w", d.info.Ordinal, err)
	}
	defer cu.PopCurrentCtx()
	return fn()
}

func (d *cudaDevice) Info() Info { return d.info }

func (d *cudaDevice) MemInfo() (free, total int64, err error) {
	err = d.do(func() error {
		free, total, err = cu.MemInfo()
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("GPU %d cuMemGetInfo: %w", d.info.Ordinal, err)
	}
	return free, total, nil
}

func (d *cudaDevice) Close() error {
	if d.closed.Swap(true) {
		return fmt.Errorf("GPU %d: %w", d.info.Ordinal, ErrClosed)
	}
	if err := d.dev.ReleasePrimaryCtx(); err != nil {
		return fmt.Errorf("GPU %d cuDevicePrimaryCtxRelease: %w", d.info.Ordinal, err)
	}
	return nil
}

func (d *cudaDevice) Alloc(size int64) (Arena, error) {
	if size <= 0 {
		return nil, fmt.Errorf("alloc %d bytes on GPU %d: %w", size, d.info.Ordinal, ErrInvalidValue)
	}
	var p cu.DevicePtr
	err := d.do(func() (err error) {
		p, err = cu.MemAlloc(size)
		return err
	})
	if err != nil {
		if errors.Is(err, cu.OutOfMemory) {
			err = fmt.Errorf("%w: %v", ErrOutOfMemory, err)
		}
		return nil, fmt.Errorf("alloc %d bytes on GPU %d: %w", size, d.info.Ordinal, err)
	}
	return &cudaArena{d: d, ptr: DevicePtr(p), size: size}, nil
}

type cudaArena struct {
	d    *cudaDevice
	ptr  DevicePtr
	size int64

	mu     sync.Mutex
	freed  bool
	handle *IPCHandle
}

func (a *cudaArena) Ptr() DevicePtr { return a.ptr }
func (a *cudaArena) Size() int64    { return a.size }

func (a *cudaArena) IPCHandle() (IPCHandle, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.freed {
		return IPCHandle{}, fmt.Errorf("export arena: %w", ErrClosed)
	}
	if a.handle != nil {
		return *a.handle, nil
	}
	var h IPCHandle
	err := a.d.do(func() (err error) {
		h, err = shimIPCGet(a.ptr)
		return err
	})
	if err != nil {
		return IPCHandle{}, fmt.Errorf("export arena on GPU %d: %w", a.d.info.Ordinal, err)
	}
	a.handle = &h
	exported.mu.Lock()
	if exported.m == nil {
		exported.m = make(map[IPCHandle]struct{})
	}
	exported.m[h] = struct{}{}
	exported.mu.Unlock()
	return h, nil
}

func (a *cudaArena) Free() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.freed {
		return fmt.Errorf("free arena: %w", ErrClosed)
	}
	a.freed = true
	if a.handle != nil {
		exported.mu.Lock()
		delete(exported.m, *a.handle)
		exported.mu.Unlock()
	}
	err := a.d.do(func() error {
		// Copies in flight on any stream may still touch the arena.
		if err := cu.Synchronize(); err != nil {
			return fmt.Errorf("cuCtxSynchronize: %w", err)
		}
		return cu.MemFree(cu.DevicePtr(a.ptr))
	})
	if err != nil {
		return fmt.Errorf("free arena on GPU %d: %w", a.d.info.Ordinal, err)
	}
	return nil
}

func (d *cudaDevice) OpenIPC(h IPCHandle) (Mapping, error) {
	exported.mu.Lock()
	_, mine := exported.m[h]
	exported.mu.Unlock()
	if mine {
		return nil, fmt.Errorf("open IPC handle on GPU %d: %w", d.info.Ordinal, ErrSameProcess)
	}
	var p DevicePtr
	var size int64
	err := d.do(func() (err error) {
		if p, err = shimIPCOpen(h); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidHandle, err)
		}
		if size, _, err = cu.DevicePtr(p).AddressRange(); err != nil {
			shimIPCClose(p)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("open IPC handle on GPU %d: %w", d.info.Ordinal, err)
	}
	return &cudaMapping{d: d, ptr: p, size: size}, nil
}

type cudaMapping struct {
	d      *cudaDevice
	ptr    DevicePtr
	size   int64
	mu     sync.Mutex
	closed bool
}

func (m *cudaMapping) Ptr() DevicePtr { return m.ptr }
func (m *cudaMapping) Size() int64    { return m.size }

func (m *cudaMapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("close IPC mapping: %w", ErrClosed)
	}
	m.closed = true
	err := m.d.do(func() error {
		if err := cu.Synchronize(); err != nil {
			return fmt.Errorf("cuCtxSynchronize: %w", err)
		}
		return shimIPCClose(m.ptr)
	})
	if err != nil {
		return fmt.Errorf("close IPC mapping on GPU %d: %w", m.d.info.Ordinal, err)
	}
	return nil
}

// RegisterHost pins b. b must be memory Go does not manage (the mmap'd host
// arena) or that the caller keeps alive until UnregisterHost: the driver keeps
// the address after the call returns.
func (d *cudaDevice) RegisterHost(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("register host memory: %w: empty range", ErrInvalidValue)
	}
	if err := d.do(func() error { return shimHostRegister(b) }); err != nil {
		return fmt.Errorf("register %d bytes of host memory: %w", len(b), err)
	}
	return nil
}

func (d *cudaDevice) UnregisterHost(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("unregister host memory: %w: empty range", ErrInvalidValue)
	}
	if err := d.do(func() error { return shimHostUnregister(b) }); err != nil {
		return fmt.Errorf("unregister host memory: %w", err)
	}
	return nil
}

type cudaStream struct {
	d      *cudaDevice
	s      cu.Stream
	mu     sync.Mutex
	closed bool
}

func (d *cudaDevice) NewStream() (Stream, error) {
	var s cu.Stream
	err := d.do(func() (err error) {
		s, err = cu.MakeStream(cu.NonBlocking)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create stream on GPU %d: %w", d.info.Ordinal, err)
	}
	return &cudaStream{d: d, s: s}, nil
}

func (s *cudaStream) Synchronize() error {
	if _, err := s.d.stream(s); err != nil {
		return err
	}
	if err := s.d.do(s.s.Synchronize); err != nil {
		return fmt.Errorf("stream synchronize on GPU %d: %w", s.d.info.Ordinal, err)
	}
	return nil
}

func (s *cudaStream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("stream: %w", ErrClosed)
	}
	s.closed = true
	err := s.d.do(func() error {
		if err := s.s.Synchronize(); err != nil {
			return err
		}
		return s.s.Destroy()
	})
	if err != nil {
		return fmt.Errorf("destroy stream on GPU %d: %w", s.d.info.Ordinal, err)
	}
	return nil
}

func (d *cudaDevice) stream(s Stream) (cu.Stream, error) {
	cs, ok := s.(*cudaStream)
	if !ok || cs == nil {
		return cu.Stream{}, fmt.Errorf("%w: stream %T is not a CUDA stream", ErrInvalidValue, s)
	}
	if cs.d.dev != d.dev {
		return cu.Stream{}, fmt.Errorf("%w: stream of GPU %d used on GPU %d", ErrInvalidValue, cs.d.info.Ordinal, d.info.Ordinal)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return cu.Stream{}, fmt.Errorf("stream: %w", ErrClosed)
	}
	return cs.s, nil
}

type cudaEvent struct {
	d      *cudaDevice
	ev     cu.Event
	mu     sync.Mutex
	closed bool
}

func (d *cudaDevice) NewEvent() (Event, error) {
	var ev cu.Event
	err := d.do(func() (err error) {
		// Blocking sync: a thread waiting on a copy's event sleeps instead
		// of spinning a core per stream in flight (the default), which on an
		// inference host belongs to the engine; the waiters here (commit
		// after a device put, a mover's copy) are not on the engine's path.
		ev, err = cu.MakeEvent(cu.DisableTiming | cu.BlockingSyncEvent)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create event on GPU %d: %w", d.info.Ordinal, err)
	}
	return &cudaEvent{d: d, ev: ev}, nil
}

func (e *cudaEvent) live() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("event: %w", ErrClosed)
	}
	return nil
}

func (e *cudaEvent) Record(s Stream) error {
	if err := e.live(); err != nil {
		return err
	}
	st, err := e.d.stream(s)
	if err != nil {
		return fmt.Errorf("record event: %w", err)
	}
	if err := e.d.do(func() error { return e.ev.Record(st) }); err != nil {
		return fmt.Errorf("record event on GPU %d: %w", e.d.info.Ordinal, err)
	}
	return nil
}

func (e *cudaEvent) Query() (bool, error) {
	if err := e.live(); err != nil {
		return false, err
	}
	err := e.d.do(e.ev.Query)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, cu.NotReady):
		return false, nil
	default:
		return false, fmt.Errorf("query event on GPU %d: %w", e.d.info.Ordinal, err)
	}
}

func (e *cudaEvent) Synchronize() error {
	if err := e.live(); err != nil {
		return err
	}
	if err := e.d.do(e.ev.Synchronize); err != nil {
		return fmt.Errorf("event synchronize on GPU %d: %w", e.d.info.Ordinal, err)
	}
	return nil
}

func (e *cudaEvent) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("event: %w", ErrClosed)
	}
	e.closed = true
	if err := e.d.do(func() error { return cu.DestroyEvent(&e.ev) }); err != nil {
		return fmt.Errorf("destroy event on GPU %d: %w", e.d.info.Ordinal, err)
	}
	return nil
}

func (d *cudaDevice) CopyHtoDAsync(dst DevicePtr, src []byte, s Stream) error {
	st, err := d.stream(s)
	if err != nil {
		return fmt.Errorf("copy H2D: %w", err)
	}
	if len(src) == 0 {
		return nil
	}
	err = d.do(func() error {
		return cu.MemcpyHtoDAsync(cu.DevicePtr(dst), unsafe.Pointer(unsafe.SliceData(src)), int64(len(src)), st)
	})
	if err != nil {
		return fmt.Errorf("copy H2D of %d bytes on GPU %d: %w", len(src), d.info.Ordinal, err)
	}
	return nil
}

func (d *cudaDevice) CopyDtoHAsync(dst []byte, src DevicePtr, s Stream) error {
	st, err := d.stream(s)
	if err != nil {
		return fmt.Errorf("copy D2H: %w", err)
	}
	if len(dst) == 0 {
		return nil
	}
	err = d.do(func() error {
		return cu.MemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), cu.DevicePtr(src), int64(len(dst)), st)
	})
	if err != nil {
		return fmt.Errorf("copy D2H of %d bytes on GPU %d: %w", len(dst), d.info.Ordinal, err)
	}
	return nil
}

func (d *cudaDevice) CopyDtoDAsync(dst, src DevicePtr, n int64, s Stream) error {
	st, err := d.stream(s)
	if err != nil {
		return fmt.Errorf("copy D2D: %w", err)
	}
	if n < 0 {
		return fmt.Errorf("copy D2D: %w: negative length %d", ErrInvalidValue, n)
	}
	if n == 0 {
		return nil
	}
	err = d.do(func() error { return cu.MemcpyDtoDAsync(cu.DevicePtr(dst), cu.DevicePtr(src), n, st) })
	if err != nil {
		return fmt.Errorf("copy D2D of %d bytes on GPU %d: %w", n, d.info.Ordinal, err)
	}
	return nil
}

func (d *cudaDevice) CanAccessPeer(peer Device) (bool, error) {
	p, ok := peer.(*cudaDevice)
	if !ok || p == nil {
		return false, fmt.Errorf("can access peer: %w: %T is not a CUDA device", ErrInvalidValue, peer)
	}
	if p.dev == d.dev {
		return false, nil
	}
	can, err := d.dev.CanAccessPeer(p.dev)
	if err != nil {
		return false, fmt.Errorf("cuDeviceCanAccessPeer(%d, %d): %w", d.info.Ordinal, p.info.Ordinal, err)
	}
	return can != 0, nil
}

func (d *cudaDevice) CopyPeerAsync(dst DevicePtr, dstDev Device, src DevicePtr, n int64, s Stream) error {
	p, ok := dstDev.(*cudaDevice)
	if !ok || p == nil {
		return fmt.Errorf("copy peer: %w: %T is not a CUDA device", ErrInvalidValue, dstDev)
	}
	st, err := d.stream(s)
	if err != nil {
		return fmt.Errorf("copy peer: %w", err)
	}
	if n < 0 {
		return fmt.Errorf("copy peer: %w: negative length %d", ErrInvalidValue, n)
	}
	if n == 0 {
		return nil
	}
	err = d.do(func() error {
		return cu.MemcpyPeerAsync(cu.DevicePtr(dst), p.ctx, cu.DevicePtr(src), d.ctx, n, st)
	})
	if err != nil {
		return fmt.Errorf("copy peer of %d bytes GPU %d → GPU %d: %w", n, d.info.Ordinal, p.info.Ordinal, err)
	}
	return nil
}
