//go:build cuda

// cuInit interposed: gorgonia.org/cu calls cuInit in its package initializer
// and exits the process (status 1) when it fails, so a cuda build of kvtierd
// (or of an engine linking the client) died at start on a host whose GPU or
// driver is absent or not ready yet. This definition in the executable takes
// precedence over libcuda's: it calls the driver's cuInit, keeps its result
// for Devices to report, and tells cu's initializer that it succeeded. Every
// other driver call fails by itself with CUDA_ERROR_NOT_INITIALIZED after a
// failed cuInit, and Devices reports the failure before making any.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <cuda.h>

static CUresult kvtier_init_result = CUDA_ERROR_NOT_INITIALIZED;
static int kvtier_init_called;

CUresult CUDAAPI cuInit(unsigned int flags) {
	CUresult (*real)(unsigned int) = (CUresult(*)(unsigned int))dlsym(RTLD_NEXT, "cuInit");
	kvtier_init_called = 1;
	if (real == 0) {
		kvtier_init_result = CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND;
	} else {
		kvtier_init_result = real(flags);
	}
	return CUDA_SUCCESS;
}

// kvtier_cuinit_result is the driver's answer to the process's cuInit; it
// makes the call if nothing has (a later cu that no longer initialises the
// driver in its package initializer).
CUresult kvtier_cuinit_result(void) {
	if (!kvtier_init_called) cuInit(0);
	return kvtier_init_result;
}
