/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Trimmed vmlinux.h: only the kernel types kvtier's programs read, each
 * marked preserve_access_index so that every field access is relocated
 * (CO-RE) against the running kernel's BTF at load time. Field offsets
 * here do not matter; names and types do. Written by hand from
 * `bpftool btf dump file /sys/kernel/btf/vmlinux format c` (6.18) rather
 * than generated at build time, so that regenerating the objects gives the
 * same bytes on any machine.
 */
#ifndef __VMLINUX_H__
#define __VMLINUX_H__

typedef unsigned char __u8;
typedef short int __s16;
typedef short unsigned int __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long int __s64;
typedef long long unsigned int __u64;
typedef __u8 u8;
typedef __s16 s16;
typedef __u16 u16;
typedef __s32 s32;
typedef __u32 u32;
typedef __s64 s64;
typedef __u64 u64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
enum { false = 0, true = 1 };
typedef int pid_t;
typedef __u32 __kernel_dev_t;
typedef __kernel_dev_t dev_t;
typedef u64 sector_t;
typedef u8 blk_status_t;

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

struct bpf_pidns_info {
	__u32 pid;
	__u32 tgid;
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	atomic_t live;
};

struct task_struct {
	pid_t pid;
	pid_t tgid;
	struct signal_struct *signal;
};

struct gendisk {
	int major;
	int first_minor;
	char disk_name[32];
};

struct request_queue {
	struct gendisk *disk; // since 5.15
};

struct request {
	struct request_queue *q;
	unsigned int cmd_flags; // blk_opf_t since 6.0: op in the low 8 bits
	sector_t __sector;
};

// struct request before 5.17, which named its disk itself (request_queue
// had no disk pointer before 5.15).
struct request___old {
	struct gendisk *rq_disk;
};

#pragma clang attribute pop

#endif /* __VMLINUX_H__ */
