// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// NVMe tier I/O latency: block requests of a set of disks (those that serve
// the state dir's volume: the disk itself, the disks under a device-mapper,
// LVM or md stack, or the path disks of an NVMe multipath head) timed from
// issue to completion, aggregated in the kernel into a log2 histogram per
// operation (0 read, 1 write).
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";


// Whether block_rq_issue still takes the request queue before the request
// (TP_PROTO(q, rq) until 5.11, (rq) since); set by the loader from the
// kernel's BTF. The verifier prunes the branch not taken.
volatile const bool issue_has_queue = false;

// Whether target_names holds any disk: set by the loader. Without it a
// request of an unwatched disk costs no name read.
volatile const bool match_names = false;

#define NSLOTS 64

struct hist {
	__u64 slots[NSLOTS]; // slot i: latencies in [2^i, 2^(i+1)) ns
	__u64 count;
	__u64 sum_ns;
};

// The disks watched, as the block layer reports them (kernel dev_t:
// major<<20|minor); filled by the loader before it attaches the programs.
// Bounded by MaxDisks on the Go side.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u8);
} targets SEC(".maps");

#define DISK_NAME_LEN 32

// The disks watched by name (zero-padded gendisk.disk_name): the hidden
// per-path disks of NVMe native multipath, which carry the requests but have
// no device number in sysfs (the kernel gives them none: device_add_disk
// leaves a GENHD_FL_HIDDEN disk's devt 0). Shares MaxDisks with targets.
struct name_key {
	char name[DISK_NAME_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, struct name_key);
	__type(value, __u8);
} target_names SEC(".maps");

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

#define REQ_OP_MASK 0xff
#define REQ_OP_READ 0
#define REQ_OP_WRITE 1

// op_of is what the classic tracepoint's rwbs string said ('R' or 'W',
// after an optional 'F' for a preflush): 0 read, 1 write, -1 anything else.
static __always_inline int op_of(struct request *rq)
{
	switch (BPF_CORE_READ(rq, cmd_flags) & REQ_OP_MASK) {
	case REQ_OP_READ:
		return 0;
	case REQ_OP_WRITE:
		return 1;
	}
	return -1;
}

// disk_of is the request's whole disk (for a request of an NVMe multipath
// namespace, the path's disk, which the head's submit_bio sent the bio to).
static __always_inline struct gendisk *disk_of(struct request *rq)
{
	struct request___old *old = (void *)rq;
	if (bpf_core_field_exists(old->rq_disk))
		return BPF_CORE_READ(old, rq_disk);
	return BPF_CORE_READ(rq, q, disk);
}

// watched reports whether the request's disk is one of the targets, and
// sets *dev to the tracepoints' dev field: the disk as a kernel dev_t
// (MKDEV(major, first_minor)), 0 without a disk.
static __always_inline bool watched(struct request *rq, __u32 *dev)
{
	struct gendisk *disk = disk_of(rq);
	*dev = 0;
	if (!disk)
		return false;
	*dev = (__u32)BPF_CORE_READ(disk, major) << 20 | (__u32)BPF_CORE_READ(disk, first_minor);
	if (bpf_map_lookup_elem(&targets, dev))
		return true;
	if (!match_names)
		return false;
	struct name_key k = {};
	if (bpf_core_read_str(k.name, sizeof(k.name), &disk->disk_name) <= 0)
		return false;
	return bpf_map_lookup_elem(&target_names, &k) != NULL;
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

// BTF-enabled raw tracepoints (5.5+): attached by BTF id with CAP_BPF and
// CAP_PERFMON alone, where classic tracepoints need their ids from tracefs
// (root only). They get the struct request the classic ones format from.
SEC("tp_btf/block_rq_issue")
int handle_issue(__u64 *ctx)
{
	// Each branch loads a fixed context slot: the barrier keeps clang from
	// merging them into one load at ctx + 8*issue_has_queue, a variable
	// context offset the verifier rejects.
	struct request *rq;
	if (issue_has_queue) {
		rq = (struct request *)ctx[1];
		barrier_var(rq);
	} else {
		rq = (struct request *)ctx[0];
		barrier_var(rq);
	}
	__u32 dev;
	if (!watched(rq, &dev))
		return 0;
	// Every op is timed; complete counts reads and writes only.
	struct rq_key k = {.sector = BPF_CORE_READ(rq, __sector), .dev = dev};
	__u64 ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&start, &k, &ts, BPF_ANY);
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(handle_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	__u32 dev;
	if (!watched(rq, &dev))
		return 0;
	struct rq_key k = {.sector = BPF_CORE_READ(rq, __sector), .dev = dev};
	__u64 *tsp = bpf_map_lookup_elem(&start, &k);
	if (!tsp)
		return 0;
	__u64 delta = bpf_ktime_get_ns() - *tsp;
	bpf_map_delete_elem(&start, &k);
	int op = op_of(rq);
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
