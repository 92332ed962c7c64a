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
//
// The usage counts the cgroup's page cache, which the kernel leaves in
// place until the limit is reached: a cgroup that has read a model's
// weights sits near its limit while most of it is reclaimable. Its
// inactive file pages count as headroom, as MemAvailable counts the
// machine's (the working set, as container runtimes measure it).
func cgroupMemory(selfCgroup, root string) (limit, avail uint64, ok bool) {
	return cgroupTightestWith(selfCgroup, root, "memory", "memory.max", "memory.current", "memory.limit_in_bytes", "memory.usage_in_bytes",
		func(dir string, v1 bool) uint64 {
			field := "inactive_file"
			if v1 {
				field = "total_inactive_file" // v1's usage counts the children too
			}
			return cgroupStat(path.Join(dir, "memory.stat"), field)
		})
}

// cgroupStat returns field's value in the "name value" lines of the stat
// file p, 0 when it cannot be read.
func cgroupStat(p, field string) uint64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		name, v, found := strings.Cut(strings.TrimSpace(line), " ")
		if found && name == field {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}

// cgroupTightest returns the tightest limit, and the least headroom (limit
// - usage), on the path from this process's cgroup up to the root, read
// from v2's limitV2 and usageV2 files, and from limitV1 and usageV1 of the
// v1 controller mounted at root/controller. ok is false when there is no
// limit.
func cgroupTightest(selfCgroup, root, controller, limitV2, usageV2, limitV1, usageV1 string) (limit, avail uint64, ok bool) {
	return cgroupTightestWith(selfCgroup, root, controller, limitV2, usageV2, limitV1, usageV1, nil)
}

// cgroupTightestWith is cgroupTightest with reclaimable, if set, the part
// of a cgroup directory's usage that does not count against its headroom
// (v1 tells which hierarchy the directory is in).
func cgroupTightestWith(selfCgroup, root, controller, limitV2, usageV2, limitV1, usageV1 string,
	reclaimable func(dir string, v1 bool) uint64) (limit, avail uint64, ok bool) {
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
	walk := func(base, rel, limitFile, usageFile string, v1 bool) {
		if rel == "" {
			return
		}
		for dir := path.Clean("/" + rel); ; dir = path.Dir(dir) {
			if l, err := readCgroupUint(path.Join(base, dir, limitFile)); err == nil && l < cgroupV1Unlimited {
				u, _ := readCgroupUint(path.Join(base, dir, usageFile))
				if reclaimable != nil {
					u -= min(reclaimable(path.Join(base, dir), v1), u)
				}
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
	walk(root, v2, limitV2, usageV2, false)
	walk(path.Join(root, controller), v1, limitV1, usageV1, true)
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
