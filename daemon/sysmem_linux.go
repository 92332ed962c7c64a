//go:build linux

package daemon

import (
	"bufio"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// readMemInfo returns the machine's MemTotal and MemAvailable in bytes,
// clamped to the cgroup memory limit of this process (v2, or v1's memory
// controller): under systemd MemoryMax= (MemoryLimit= on v1) or in a
// container, the memfd arena is charged to our cgroup, so
// sizing it from the whole host's RAM would get the daemon OOM-killed.
func readMemInfo() (memInfo, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return memInfo{}, err
	}
	defer f.Close()
	m, err := parseMemInfo(f)
	if err != nil {
		return memInfo{}, err
	}
	if limit, avail, ok := cgroupMemory("/proc/self/cgroup", "/sys/fs/cgroup"); ok {
		m.Total = min(m.Total, limit)
		m.Available = min(m.Available, avail)
	}
	return m, nil
}

// cgroupMemory returns the tightest memory limit, and the least headroom
// (limit - usage), on the path from this process's cgroup up to the root:
// memory.max of cgroup v2, or memory.limit_in_bytes of the v1 memory
// controller (a v1 or hybrid host, where systemd's MemoryLimit= and
// container limits live there), mounted at root/memory. ok is false when
// there is no limit.
func cgroupMemory(selfCgroup, root string) (limit, avail uint64, ok bool) {
	return cgroupTightest(selfCgroup, root, "memory", "memory.max", "memory.current", "memory.limit_in_bytes", "memory.usage_in_bytes")
}

// cgroupTightest returns the tightest limit, and the least headroom (limit
// - usage), on the path from this process's cgroup up to the root, read
// from v2's limitV2 and usageV2 files, and from limitV1 and usageV1 of the
// v1 controller mounted at root/controller. ok is false when there is no
// limit.
func cgroupTightest(selfCgroup, root, controller, limitV2, usageV2, limitV1, usageV1 string) (limit, avail uint64, ok bool) {
	f, err := os.Open(selfCgroup)
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	var v1, v2 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "hierarchy-id:controller,list:path"; the unified hierarchy is
		// the "0::<path>" line.
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case slices.Contains(strings.Split(parts[1], ","), controller):
			v1 = parts[2]
		}
	}
	walk := func(base, rel, limitFile, usageFile string) {
		if rel == "" {
			return
		}
		for dir := path.Clean("/" + rel); ; dir = path.Dir(dir) {
			if l, err := readCgroupUint(path.Join(base, dir, limitFile)); err == nil && l < cgroupV1Unlimited {
				u, _ := readCgroupUint(path.Join(base, dir, usageFile))
				a := l - min(u, l)
				if !ok {
					limit, avail, ok = l, a, true
				}
				limit, avail = min(limit, l), min(avail, a)
			}
			if dir == "/" {
				break
			}
		}
	}
	walk(root, v2, limitV2, usageV2)
	walk(path.Join(root, controller), v1, limitV1, usageV1)
	return limit, avail, ok
}

// cgroupV1Unlimited: v1 reports no limit as the largest page-aligned
// int64 (9223372036854771712); anything this large is no limit.
const cgroupV1Unlimited = 1 << 62

// readCgroupUint parses a cgroup value file; "max" (no limit) is an error.
func readCgroupUint(p string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}
