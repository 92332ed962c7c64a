package cudaipc

import (
	"encoding/hex"
	"errors"
)

// DevicePtr is an address in a device's memory, as CUdeviceptr. Pointer
// arithmetic (Ptr()+offset) is allowed within one Arena or Mapping.
type DevicePtr uintptr

// UUID identifies a GPU across processes (cuDeviceGetUuid). Clients match
// the daemon's arenas to their own device by UUID, never by ordinal: ordinals
// depend on CUDA_VISIBLE_DEVICES of each process.
type UUID [16]byte

// String formats u the way nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func (u UUID) String() string {
	h := hex.EncodeToString(u[:])
	return "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// IPCHandleSize is the size of an IPCHandle, as CU_IPC_HANDLE_SIZE.
const IPCHandleSize = 64

// IPCHandle names an exported Arena so that another process can map it with
// Device.OpenIPC, like CUipcMemHandle. It is opaque bytes: send it over the
// control socket as is. It is not a capability: it stays valid only while the
// exporting process keeps the Arena.
type IPCHandle [IPCHandleSize]byte

// Info describes a device.
type Info struct {
	Ordinal  int  // index in this process's device list
	UUID     UUID // stable across processes
	Name     string
	TotalMem int64 // bytes
}

// Arena is a block of device memory owned by this process.
type Arena interface {
	Ptr() DevicePtr
	Size() int64
	// IPCHandle exports the arena (cuIpcGetMemHandle). Export once, at
	// start; the handle is valid until Free or until this process exits.
	IPCHandle() (IPCHandle, error)
	// Free releases the memory (cuMemFree). Like cuMemFree it waits for the
	// copies in flight on this process's streams first. Importers must have
	// closed their mappings; touching one afterwards is undefined.
	Free() error
}

// Mapping is another process's Arena opened through its IPCHandle.
type Mapping interface {
	Ptr() DevicePtr
	Size() int64
	// Close unmaps it (cuIpcCloseMemHandle) after the copies in flight
	// on this process's streams.
	Close() error
}

// Stream is an ordered queue of asynchronous copies on one device.
type Stream interface {
	// Synchronize waits until every copy queued so far has completed and
	// returns the first error any of them hit.
	Synchronize() error
	// Close waits for the queued copies and destroys the stream.
	Close() error
}

// Event marks a point in a stream: completion is tied to the copies queued
// before Record, not to the whole device.
type Event interface {
	// Record captures the stream's current tail; a later Record replaces it.
	Record(s Stream) error
	// Query reports whether the recorded work has completed, without
	// blocking. An event never recorded is complete.
	Query() (done bool, err error)
	// Synchronize waits for the recorded work.
	Synchronize() error
	Close() error
}

// Allocator allocates device memory. The daemon is the only allocator of
// shared arenas.
type Allocator interface {
	Alloc(size int64) (Arena, error)
}

// IPCOpener maps arenas exported by another process.
type IPCOpener interface {
	// OpenIPC maps h (cuIpcOpenMemHandle with lazy peer access). Open it
	// on the device that exported it (match by UUID). It fails with
	// ErrSameProcess in the exporting process and with ErrInvalidHandle
	// when the arena is gone.
	OpenIPC(h IPCHandle) (Mapping, error)
}

// HostRegistrar pins host memory for DMA. Registration is slow (about 1–2 GB/s):
// do it once at start or in the background, never on a request path.
type HostRegistrar interface {
	// RegisterHost pins b (cuMemHostRegister, portable). b must stay
	// allocated (and mapped) until UnregisterHost.
	RegisterHost(b []byte) error
	// UnregisterHost unpins memory registered with the same b.
	UnregisterHost(b []byte) error
}

// Copier queues asynchronous copies. Host slices passed in must stay valid and
// untouched until the stream (or an event recorded after the copy) completes.
type Copier interface {
	NewStream() (Stream, error)
	NewEvent() (Event, error)
	CopyHtoDAsync(dst DevicePtr, src []byte, s Stream) error
	CopyDtoHAsync(dst []byte, src DevicePtr, s Stream) error
	CopyDtoDAsync(dst, src DevicePtr, n int64, s Stream) error
}

// PeerCopier copies between GPUs.
type PeerCopier interface {
	// CanAccessPeer reports whether this device reaches peer's memory
	// directly (NVLink/PCIe P2P). CopyPeerAsync works either way; without
	// direct access the driver stages through host memory.
	CanAccessPeer(peer Device) (bool, error)
	// CopyPeerAsync copies n bytes from src on this device to dst on
	// dstDev, queued on s (a stream of this device).
	CopyPeerAsync(dst DevicePtr, dstDev Device, src DevicePtr, n int64, s Stream) error
}

// Device is one GPU as seen by this process: what the daemon and the client
// library need, and nothing else.
type Device interface {
	Info() Info
	// MemInfo reports free and total device memory (cuMemGetInfo).
	MemInfo() (free, total int64, err error)
	Allocator
	IPCOpener
	HostRegistrar
	Copier
	PeerCopier
	// Close releases this handle on the device (the primary context
	// reference). Arenas, mappings, streams and events must be released
	// first.
	Close() error
}

// Sentinel errors; every error is wrapped with context, test with errors.Is.
var (
	// ErrNoDevice: no GPU (the GPU tier is off).
	ErrNoDevice = errors.New("no GPU device")
	// ErrSameProcess: an IPC handle opened in the process that exported it,
	// which CUDA does not allow; use the Arena directly.
	ErrSameProcess = errors.New("IPC handle opened in the exporting process")
	// ErrInvalidHandle: an IPC handle that is malformed, from another device,
	// or whose arena was freed or whose exporter exited.
	ErrInvalidHandle = errors.New("invalid IPC handle")
	// ErrClosed: use of a freed arena, closed mapping, stream, event or device.
	ErrClosed = errors.New("cudaipc: use of closed object")
	// ErrOutOfMemory: the device cannot hold the allocation.
	ErrOutOfMemory = errors.New("out of device memory")
	// ErrInvalidValue: an argument out of range, such as a copy outside
	// any arena or a stream of another device.
	ErrInvalidValue = errors.New("invalid argument")
	// ErrNotSupported: a call this build cannot do (HoldStream on a real GPU).
	ErrNotSupported = errors.New("not supported by this build")
)
