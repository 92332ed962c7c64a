// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// NVMe tier I/O latency: block requests of one device (the disk that backs
// the state dir) timed from issue to completion, aggregated in the kernel
// into a log2 histogram per operation (0 read, 1 write).
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// The device as the block layer reports it (kernel dev_t: major<<20|minor),
// set by the loader.
volatile const __u32 target_dev = 0;

#define NSLOTS 64

struct hist {
	__u64 slots[NSLOTS]; // slot i: latencies in [2^i, 2^(i+1)) ns
	__u64 count;
	__u64 sum_ns;
};

struct rq_key {
	__u64 sector;
	__u32 dev;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct rq_key);
	__type(value, __u64); // issue time, ns
} start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct hist);
} hists SEC(".maps");

static __always_inline int op_of(const char *rwbs)
{
	// rwbs: an optional 'F' (preflush), then R, W, D (discard), E or N.
	#pragma unroll
	for (int i = 0; i < 2; i++) {
		char c = rwbs[i];
		if (c == 'R')
			return 0;
		if (c == 'W')
			return 1;
		if (c != 'F')
			return -1;
	}
	return -1;
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0;
	#pragma unroll
	for (int s = 32; s > 0; s >>= 1) {
		if (v >> s) {
			v >>= s;
			r += s;
		}
	}
	return r;
}

SEC("tracepoint/block/block_rq_issue")
int handle_issue(struct trace_event_raw_block_rq *ctx)
{
	if (BPF_CORE_READ(ctx, dev) != target_dev)
		return 0;
	struct rq_key k = {.sector = BPF_CORE_READ(ctx, sector), .dev = target_dev};
	__u64 ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&start, &k, &ts, BPF_ANY);
	return 0;
}

SEC("tracepoint/block/block_rq_complete")
int handle_complete(struct trace_event_raw_block_rq_completion *ctx)
{
	if (BPF_CORE_READ(ctx, dev) != target_dev)
		return 0;
	struct rq_key k = {.sector = BPF_CORE_READ(ctx, sector), .dev = target_dev};
	__u64 *tsp = bpf_map_lookup_elem(&start, &k);
	if (!tsp)
		return 0;
	__u64 delta = bpf_ktime_get_ns() - *tsp;
	bpf_map_delete_elem(&start, &k);
	char rwbs[4] = {};
	bpf_core_read(&rwbs, sizeof(rwbs), &ctx->rwbs);
	int op = op_of(rwbs);
	if (op < 0)
		return 0;
	__u32 key = op;
	struct hist *h = bpf_map_lookup_elem(&hists, &key);
	if (!h)
		return 0;
	__u32 slot = log2_u64(delta);
	if (slot >= NSLOTS)
		slot = NSLOTS - 1;
	__sync_fetch_and_add(&h->slots[slot], 1);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, delta);
	return 0;
}
