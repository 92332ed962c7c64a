//go:build cuda

package cudaipc

// The driver calls gorgonia.org/cu does not wrap. cgo lives only in this
// package and only under the cuda tag. Every call needs the device's context
// current on the calling thread: call these inside cudaDevice.do.

/*
#cgo LDFLAGS: -lcuda -ldl
#cgo linux CFLAGS: -I/usr/local/cuda/include
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64
#include <cuda.h>
#include <stdint.h>
#include <string.h>

_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle is not 64 bytes");

// In cuinit_cuda.c, with the interposed cuInit.
CUresult kvtier_cuinit_result(void);

static CUresult kvtier_ipc_get(CUdeviceptr p, void *out) {
	CUipcMemHandle h;
	CUresult r = cuIpcGetMemHandle(&h, p);
	if (r == CUDA_SUCCESS) memcpy(out, &h, sizeof h);
	return r;
}

static CUresult kvtier_ipc_open(CUdeviceptr *p, const void *in) {
	CUipcMemHandle h;
	memcpy(&h, in, sizeof h);
	return cuIpcOpenMemHandle(p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
}

static CUresult kvtier_ipc_close(CUdeviceptr p) { return cuIpcCloseMemHandle(p); }

// The host range is passed as an integer: it is memory Go does not manage
// (an mmap'd arena) or that the caller keeps alive while registered.
static CUresult kvtier_host_register(uintptr_t p, size_t n) {
	return cuMemHostRegister((void *)p, n, CU_MEMHOSTREGISTER_PORTABLE);
}

static CUresult kvtier_host_unregister(uintptr_t p) { return cuMemHostUnregister((void *)p); }

static CUresult kvtier_uuid(CUdevice d, void *out) {
	CUuuid u;
	CUresult r = cuDeviceGetUuid(&u, d);
	if (r == CUDA_SUCCESS) memcpy(out, &u, sizeof u);
	return r;
}

static const char *kvtier_error_name(CUresult r) {
	const char *s = 0;
	if (cuGetErrorName(r, &s) != CUDA_SUCCESS) return 0;
	return s;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// cuError is a CUresult from a shim call.
type cuError struct {
	op   string
	code int
}

func (e *cuError) Error() string {
	name := "unknown CUDA error"
	if s := C.kvtier_error_name(C.CUresult(e.code)); s != nil {
		name = C.GoString(s)
	}
	return fmt.Sprintf("%s: %s (%d)", e.op, name, e.code)
}

func cuResult(op string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return &cuError{op: op, code: int(r)}
}

// shimInitError is the driver's failure to initialise (cuInit), nil if it
// succeeded.
func shimInitError() error {
	return cuResult("cuInit", C.kvtier_cuinit_result())
}

// cuErrNoDevice is CUDA_ERROR_NO_DEVICE: the driver loaded and found no GPU.
const cuErrNoDevice = int(C.CUDA_ERROR_NO_DEVICE)

func shimIPCGet(p DevicePtr) (IPCHandle, error) {
	var h IPCHandle
	err := cuResult("cuIpcGetMemHandle", C.kvtier_ipc_get(C.CUdeviceptr(p), unsafe.Pointer(&h[0])))
	return h, err
}

func shimIPCOpen(h IPCHandle) (DevicePtr, error) {
	var p C.CUdeviceptr
	err := cuResult("cuIpcOpenMemHandle", C.kvtier_ipc_open(&p, unsafe.Pointer(&h[0])))
	return DevicePtr(p), err
}

func shimIPCClose(p DevicePtr) error {
	return cuResult("cuIpcCloseMemHandle", C.kvtier_ipc_close(C.CUdeviceptr(p)))
}

func shimHostRegister(b []byte) error {
	return cuResult("cuMemHostRegister", C.kvtier_host_register(C.uintptr_t(hostBase(b)), C.size_t(len(b))))
}

func shimHostUnregister(b []byte) error {
	return cuResult("cuMemHostUnregister", C.kvtier_host_unregister(C.uintptr_t(hostBase(b))))
}

func shimUUID(dev int) (UUID, error) {
	var u UUID
	err := cuResult("cuDeviceGetUuid", C.kvtier_uuid(C.CUdevice(dev), unsafe.Pointer(&u[0])))
	return u, err
}

func hostBase(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
