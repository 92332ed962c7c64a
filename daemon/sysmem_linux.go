//go:build linux

package daemon

import (
	"bufio"
	"os"
	"path"
	"strconv"
	"strings"
)

// readMemInfo returns the machine's MemTotal and MemAvailable in bytes,
// clamped to the cgroup v2 memory limit of this process: under systemd
// MemoryMax= or in a container, the memfd arena is charged to our cgroup, so
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

// cgroupMemory returns the tightest memory.max, and the least headroom
// (memory.max - memory.current), on the path from this process's cgroup v2
// up to the root. ok is false when there is no cgroup v2 or no limit.
func cgroupMemory(selfCgroup, root string) (limit, avail uint64, ok bool) {
	f, err := os.Open(selfCgroup)
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	var rel string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// The unified hierarchy is the "0::<path>" line.
		if p, found := strings.CutPrefix(sc.Text(), "0::"); found {
			rel = p
		}
	}
	if rel == "" {
		return 0, 0, false
	}
	for dir := path.Clean("/" + rel); ; dir = path.Dir(dir) {
		if l, err := readCgroupUint(path.Join(root, dir, "memory.max")); err == nil {
			u, _ := readCgroupUint(path.Join(root, dir, "memory.current"))
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
	return limit, avail, ok
}

// readCgroupUint parses a cgroup value file; "max" (no limit) is an error.
func readCgroupUint(p string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}
