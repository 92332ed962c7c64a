//go:build linux

package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCgroupMemory(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(dir, "cg")
	write("self", "4:memory:/v1path\n0::/system.slice/kvtierd.service\n")
	write("cg/system.slice/kvtierd.service/memory.max", "max\n")
	write("cg/system.slice/kvtierd.service/memory.current", "100\n")
	write("cg/system.slice/memory.max", "8000\n")
	write("cg/system.slice/memory.current", "7000\n")
	limit, avail, ok := cgroupMemory(filepath.Join(dir, "self"), root)
	if !ok || limit != 8000 || avail != 1000 {
		t.Errorf("got %d %d %v, want 8000 1000 true", limit, avail, ok)
	}

	write("self2", "0::/\n")
	if _, _, ok := cgroupMemory(filepath.Join(dir, "self2"), root); ok {
		t.Error("no limit at root: want ok=false")
	}
	if _, _, ok := cgroupMemory(filepath.Join(dir, "missing"), root); ok {
		t.Error("no cgroup file: want ok=false")
	}
}

func TestReadMemInfo(t *testing.T) {
	m, err := readMemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if m.Total == 0 || m.Available > m.Total {
		t.Errorf("implausible %+v", m)
	}
}

// TestCgroupMemoryV1: on a cgroup v1 or hybrid host (the memory controller
// on the v1 hierarchy, systemd's MemoryLimit= or a container's limit), the
// limit used to be ignored: the arena was sized from the whole host's RAM
// and the daemon got OOM-killed at its limit.
func TestCgroupMemoryV1(t *testing.T) {
	const unlimited = "9223372036854771712\n" // v1's "no limit"
	tests := []struct {
		name         string
		self         string
		files        map[string]string
		limit, avail uint64
		ok           bool
	}{{
		name: "hybrid, limit on the parent",
		self: "9:name=systemd:/system.slice/kvtierd.service\n4:memory:/system.slice/kvtierd.service\n0::/system.slice/kvtierd.service\n",
		files: map[string]string{
			"memory/system.slice/kvtierd.service/memory.limit_in_bytes": unlimited,
			"memory/system.slice/kvtierd.service/memory.usage_in_bytes": "100\n",
			"memory/system.slice/memory.limit_in_bytes":                 "6000\n",
			"memory/system.slice/memory.usage_in_bytes":                 "1000\n",
			"memory/memory.limit_in_bytes":                              unlimited,
			"memory/memory.usage_in_bytes":                              "50000\n",
		},
		limit: 6000, avail: 5000, ok: true,
	}, {
		name: "v1 container: its own cgroup is the mount's root",
		self: "4:cpuacct,memory:/docker/abc\n",
		files: map[string]string{
			"memory/memory.limit_in_bytes": "4096\n",
			"memory/memory.usage_in_bytes": "5000\n",
		},
		limit: 4096, avail: 0, ok: true,
	}, {
		name: "v1, no limit anywhere",
		self: "4:memory:/user.slice\n",
		files: map[string]string{
			"memory/user.slice/memory.limit_in_bytes": unlimited,
			"memory/memory.limit_in_bytes":            unlimited,
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			self, root := fakeCgroup(t, tc.self, tc.files)
			limit, avail, ok := cgroupMemory(self, root)
			if ok != tc.ok || (ok && (limit != tc.limit || avail != tc.avail)) {
				t.Errorf("got %d %d %v, want %d %d %v", limit, avail, ok, tc.limit, tc.avail, tc.ok)
			}
		})
	}
}

// fakeCgroup writes a cgroup tree of files (paths under the mount root) and
// a /proc/self/cgroup of self; it returns the two paths cgroupMemory reads.
func fakeCgroup(t *testing.T, self string, files map[string]string) (selfPath, root string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "cg")
	for rel, body := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	selfPath = filepath.Join(dir, "self")
	if err := os.WriteFile(selfPath, []byte(self), 0o644); err != nil {
		t.Fatal(err)
	}
	return selfPath, root
}
