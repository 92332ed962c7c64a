// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Client exit tracing: reports the death of a process (thread group) whose
// tgid is in the clients map, through a ring buffer. The daemon adds a
// client's pid (SO_PEERCRED) when its session opens and removes it when the
// session closes, so the program does no work for any other process.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Set by the loader when the daemon runs in a pid namespace other than the
// initial one: pids are then translated into it (SO_PEERCRED pids are the
// daemon's namespace's pids).
volatile const __u64 pidns_dev = 0;
volatile const __u64 pidns_ino = 0;

struct exit_event {
	__u32 tgid;
	__u32 pid;    // the thread that exited last
	__u64 ts_ns;  // bpf_ktime_get_ns (CLOCK_MONOTONIC)
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);   // tgid
	__type(value, __u32); // sessions of that tgid (informational)
} clients SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
	__type(value, struct exit_event);
} exits SEC(".maps");

// A BTF-enabled raw tracepoint (5.5+): attached by BTF id with CAP_BPF and
// CAP_PERFMON alone, where a classic tracepoint needs its id from tracefs
// (root only). The tracepoint fires in do_exit, so p is the current task.
SEC("tp_btf/sched_process_exit")
int BPF_PROG(handle_exit, struct task_struct *p)
{
	__u32 tgid, pid;
	if (pidns_ino) {
		struct bpf_pidns_info ns = {};
		if (bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)))
			return 0; // not visible in the daemon's namespace
		tgid = ns.tgid;
		pid = ns.pid;
	} else {
		__u64 id = bpf_get_current_pid_tgid();
		tgid = id >> 32;
		pid = (__u32)id;
	}
	if (!bpf_map_lookup_elem(&clients, &tgid))
		return 0;
	// Every thread of the group passes here; the group is dead when the
	// last one has dropped signal->live (do_exit decrements it before
	// this tracepoint).
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0;
	struct exit_event *e = bpf_ringbuf_reserve(&exits, sizeof(*e), 0);
	if (!e)
		return 0;
	e->tgid = tgid;
	e->pid = pid;
	e->ts_ns = bpf_ktime_get_ns();
	bpf_ringbuf_submit(e, 0);
	return 0;
}
