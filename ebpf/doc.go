// Package ebpf holds kvtierd's eBPF programs and their loaders, built on
// github.com/cilium/ebpf:
//
//   - ExitTracer (sched_process_exit): reports the death of a
//     connected client's process, filtered in the kernel by a map of the
//     clients' tgids, through a ring buffer. The daemon stops that pid's
//     sessions at once, even when a forked child still holds the socket
//     (whose EOF stays the fallback).
//   - IOLatency (block_rq_issue, block_rq_complete): a log2
//     histogram per operation of the I/O latency of the disks behind the
//     NVMe tier (DisksOf: the disk, or those under a device-mapper, LVM
//     or md volume), aggregated in the kernel and exported by IOCollector as
//     kvtier_nvme_io_latency_seconds{op}.
//   - ReclaimProbe (mm_vmscan_direct_reclaim_begin/end): direct
//     reclaim stalls and their total duration, the host memory pressure
//     signal; PSI (/proc/pressure/memory) is the fallback. Controller turns
//     either into a target ratio for the host tier's watermarks.
//
// The C sources are in bpf/, compiled by bpf2go (gen.go) into the committed
// *_bpfel.go and *_bpfel.o files; CO-RE relocates their field accesses
// against the running kernel's BTF.
//
// Ownership: every loader returns a value that owns its programs, maps,
// links and (for ExitTracer) the ring buffer reader; Close releases them
// all and unblocks a pending ExitTracer.Read with os.ErrClosed. Nothing in
// this package starts a goroutine except Controller.Run, which returns when
// its context ends.
//
// Every program is a BTF-enabled raw tracepoint (SEC("tp_btf/..."),
// attached with link.AttachTracing by the tracepoint's BTF id), not a
// classic tracepoint: those need their event ids from tracefs, which only
// root may read, so they would fail under the systemd unit's unprivileged
// user. Loading needs CAP_BPF and CAP_PERFMON (or root) and the kernel's
// BTF (CONFIG_DEBUG_INFO_BTF), on Linux 5.8 or later (CAP_BPF; tp_btf
// itself is 5.5); tracefs is not needed. Each loader fails with an error
// that wraps ErrUnavailable and says what is missing, so that the daemon
// can log one line per program and use its fallback.
package ebpf
