// Package cudaipc is kvtier's GPU layer: the small Device interface the daemon
// and the client library need (enumeration, arenas, CUDA IPC export and open,
// pinned host registration, asynchronous copies on streams with events, peer
// copies), with two implementations chosen at build time:
//
//   - default build: emulated GPUs, so that the whole GPU tier is tested on
//     machines without one. Configured by KVTIER_EMULATED_GPUS ("N" or
//     "N:SIZE", e.g. "2:1GiB"); unset means no GPU (Devices returns
//     ErrNoDevice and the GPU tier is off).
//   - build tag cuda: the CUDA driver API through gorgonia.org/cu plus a small
//     cgo shim (shim_cuda.go) for IPC handles and host registration. cgo lives
//     only in this package and only under that tag.
//
// # Ownership and lifetimes
//
//   - A Device from Devices holds a reference on the GPU's primary context
//     until Close. Everything created from it (arenas, mappings, streams,
//     events) must be released before.
//   - An Arena is device memory owned by the process that allocated it. Its
//     IPCHandle stays valid until Free or until the process exits; export once,
//     at start. Free waits for the copies queued on this process's streams.
//   - A Mapping (OpenIPC) is another process's Arena. Open it on the device that
//     exported it (match the UUID from the handshake, never the ordinal), close
//     it before the exporter frees the arena, and never touch it after the
//     exporter exited: CUDA frees the memory with the exporting process. A
//     handle cannot be opened in the exporting process (ErrSameProcess).
//   - Host memory given to RegisterHost stays pinned until UnregisterHost; it
//     must be memory Go does not manage (the mmap'd host arena). Registration
//     runs at about 1–2 GB/s: do it once at start, never on a request.
//   - Copies are asynchronous: the host slices passed in belong to the stream
//     until Stream.Synchronize, or Event.Synchronize/Query on an event recorded
//     after the copy. Completion is per stream or event, never a device-wide
//     synchronize.
//   - Every method may be called from any goroutine; the cuda build makes the
//     context current on a locked OS thread for each driver call.
//
// # The emulation
//
// Device memory is one sealed memfd per arena (F_SEAL_SHRINK|F_SEAL_GROW),
// mapped shared; a DevicePtr is its address in this process. An IPC handle
// carries the exporter's pid, the memfd's fd number, the size and a random
// nonce that is also in the memfd's name; the importer opens
// /proc/<pid>/fd/<fd>, checks the name, seals and size of the file it got, and
// maps it. So importing needs the same user (or CAP_SYS_PTRACE) and pid
// namespace as the exporter, and a handle of a freed arena or of an exited
// exporter fails with ErrInvalidHandle. Unlike CUDA, a mapping stays readable
// after the exporter exits. Each stream is a goroutine that runs its copies
// (memmove) in order, so the race detector reports a host buffer read before
// its copy was synchronized; HoldStream gates a stream, as the caller's own
// kernels would, so tests can show that completion follows the stream's
// events and not the calls that queued the copies. Copies are bounds-checked against the arenas and
// mappings of the device (ErrInvalidValue); real GPUs do not check. UUIDs are
// derived from the ordinal; peer access between emulated devices is allowed.
// Free memory counts this process's allocations only.
//
// # Building with CUDA on a GPU host
//
// The cuda build needs the CUDA driver (libcuda.so.1, from the NVIDIA driver)
// at run time and cuda.h plus libcuda.so at build time, from the CUDA toolkit
// (default paths /usr/local/cuda/include and /usr/local/cuda/lib64) or from
// Debian's non-free packages (apt install nvidia-cuda-dev libcuda1 with the
// contrib and non-free components enabled; cuda.h lands in /usr/include and
// libcuda.so in /usr/lib/x86_64-linux-gnu/nvidia/current, linked from
// /usr/lib/x86_64-linux-gnu by the driver's alternatives). Then:
//
//	go build -tags cuda ./cmd/kvtierd
//	go test -tags cuda ./cudaipc/        # the conformance suite on the real GPUs
//
// With headers or libraries elsewhere (or "cannot find -lcuda"), say so through
// cgo's variables:
//
//	CGO_CFLAGS=-I/opt/cuda/include CGO_LDFLAGS=-L/opt/cuda/lib64 go build -tags cuda ./...
//	CGO_LDFLAGS=-L/usr/lib/x86_64-linux-gnu/nvidia/current go build -tags cuda ./...
//
// A binary built with -tags cuda links libcuda.so.1 dynamically, so it needs
// the driver's library installed, but not a working GPU: gorgonia.org/cu calls
// cuInit in its package initializer and exits the process (status 1) when
// that fails, so cuinit_cuda.c interposes cuInit, keeps the driver's answer
// and lets the initializer pass; Devices then fails (ErrNoDevice for
// CUDA_ERROR_NO_DEVICE) and kvtierd runs with its GPU tier off, saying why.
// That is also what a start before the driver is ready gets (restart the
// daemon to take the GPUs up). CI runs the cuda test binary and daemon this
// way. The default (emulated) build finds no device unless
// KVTIER_EMULATED_GPUS is set.
//
// CI (.ci/run) compile-checks the cuda build without a GPU: it vets this
// package and builds every package and test binary with the tag against the
// headers of nvidia-cuda-dev and the library of libcuda1, unpacked into a cache.
package cudaipc
