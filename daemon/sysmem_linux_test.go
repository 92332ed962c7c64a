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
