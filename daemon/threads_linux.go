//go:build linux

package daemon

import (
	"bufio"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
)

// threadLimit reports how many threads kvtierd may have in all: the least
// of the Go runtime's thread limit and what its cgroup's task limit
// (pids.max, v2 or the v1 pids controller: a unit's TasksMax=, a
// container's pids limit) leaves it beside the cgroup's other tasks. ok is
// false when it cannot be read. what names the limit that binds.
func threadLimit() (limit int, what string, ok bool) {
	own, err := ownThreads()
	if err != nil {
		return 0, "", false
	}
	limit, what = goMaxThreads(), fmt.Sprintf("the Go runtime's thread limit %d", goMaxThreads())
	if pidsMax, avail, cok := cgroupTightest("/proc/self/cgroup", "/sys/fs/cgroup", "pids", "pids.max", "pids.current", "pids.max", "pids.current"); cok {
		if l := own + int(min(avail, 1<<30)); l < limit {
			limit, what = l, fmt.Sprintf("the cgroup's task limit (pids.max %d)", pidsMax)
		}
	}
	return limit, what, true
}

// ownThreads is the number of this process's threads.
func ownThreads() (int, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, found := strings.CutPrefix(sc.Text(), "Threads:"); found {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no Threads line in /proc/self/status")
}

// goMaxThreads is the runtime's thread limit (debug.SetMaxThreads), read
// at start by setting it to itself (while the process has few threads).
var goMaxThreads = sync.OnceValue(func() int {
	n := debug.SetMaxThreads(10000)
	debug.SetMaxThreads(n)
	return n
})

func init() { goMaxThreads() }
