//go:build linux

package daemon

import (
	"testing"
)

// TestCgroupMemoryPageCacheIsHeadroom: a cgroup's usage counts its page
// cache, which the kernel leaves in place until the limit is reached. A
// container that had read a model's 40 GiB of weights used to read as
// having 1 GiB of headroom, and an unset host.capacity became 512 MiB
// instead of 16 GiB; the machine's MemAvailable counts the same cache as
// available.
func TestCgroupMemoryPageCacheIsHeadroom(t *testing.T) {
	const gib = uint64(GiB)
	tests := []struct {
		name         string
		self         string
		files        map[string]string
		limit, avail uint64
	}{{
		name: "v2: inactive file pages count as headroom",
		self: "0::/kubepods/pod1/ctr\n",
		files: map[string]string{
			"kubepods/pod1/ctr/memory.max":     "68719476736\n", // 64 GiB
			"kubepods/pod1/ctr/memory.current": "67645734912\n", // 63 GiB
			"kubepods/pod1/ctr/memory.stat":    "anon 12884901888\nfile 50465865728\nactive_file 6442450944\ninactive_file 42949672960\nshmem 0\n",
		},
		limit: 64 * gib, avail: 64*gib - (63*gib - 40*gib),
	}, {
		name: "v1: total_inactive_file (usage counts the children)",
		self: "4:memory:/docker/abc\n",
		files: map[string]string{
			"memory/docker/abc/memory.limit_in_bytes": "68719476736\n",
			"memory/docker/abc/memory.usage_in_bytes": "67645734912\n",
			"memory/docker/abc/memory.stat":           "cache 50465865728\ninactive_file 1073741824\ntotal_inactive_file 42949672960\n",
		},
		limit: 64 * gib, avail: 64*gib - (63*gib - 40*gib),
	}, {
		name: "no memory.stat: usage as it is",
		self: "0::/a\n",
		files: map[string]string{
			"a/memory.max":     "8000\n",
			"a/memory.current": "7000\n",
		},
		limit: 8000, avail: 1000,
	}, {
		name: "stat larger than usage (read at another instant): no wrap",
		self: "0::/a\n",
		files: map[string]string{
			"a/memory.max":     "8000\n",
			"a/memory.current": "7000\n",
			"a/memory.stat":    "inactive_file 9000\n",
		},
		limit: 8000, avail: 8000,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			self, root := fakeCgroup(t, tc.self, tc.files)
			limit, avail, ok := cgroupMemory(self, root)
			if !ok || limit != tc.limit || avail != tc.avail {
				t.Errorf("got limit %d avail %d ok %v, want %d %d true", limit, avail, ok, tc.limit, tc.avail)
			}
		})
	}
}
