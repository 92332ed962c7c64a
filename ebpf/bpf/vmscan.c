// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Host memory pressure: direct-reclaim stalls (a task that had to reclaim
// memory itself before its allocation could proceed), counted with their
// total duration.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct reclaim_stats {
	__u64 stalls;   // completed direct reclaims
	__u64 stall_ns; // their total duration
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);   // pid (thread)
	__type(value, __u64); // begin, ns
} reclaim_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct reclaim_stats);
} reclaim SEC(".maps");

// BTF-enabled raw tracepoints (5.5+): attached by BTF id, no tracefs.
// Their arguments (order, gfp_flags; nr_reclaimed) are not needed.
SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(handle_reclaim_begin)
{
	__u32 pid = (__u32)bpf_get_current_pid_tgid();
	__u64 ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&reclaim_start, &pid, &ts, BPF_ANY);
	return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int BPF_PROG(handle_reclaim_end)
{
	__u32 pid = (__u32)bpf_get_current_pid_tgid();
	__u64 *tsp = bpf_map_lookup_elem(&reclaim_start, &pid);
	if (!tsp)
		return 0;
	__u64 delta = bpf_ktime_get_ns() - *tsp;
	bpf_map_delete_elem(&reclaim_start, &pid);
	__u32 zero = 0;
	struct reclaim_stats *s = bpf_map_lookup_elem(&reclaim, &zero);
	if (!s)
		return 0;
	__sync_fetch_and_add(&s->stalls, 1);
	__sync_fetch_and_add(&s->stall_ns, delta);
	return 0;
}
