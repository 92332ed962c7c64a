package daemon

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// wchar is the bytes this process has passed to write(2) and the like.
func wchar(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io: %v", err)
	}
	for line := range bytes.Lines(b) {
		if v, ok := strings.CutPrefix(string(line), "wchar: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no wchar in /proc/self/io")
	return 0
}

// TestRegisterCostIndependentOfSize: every new namespace rewrote (and
// fsynced) the whole registry, so n registrations wrote O(n²) bytes: a peer
// naming a new namespace in each hello (it may, up to maxNamespaces) had
// the daemon write ~1 TB and spend half a second per hello near the end,
// while every other new model's hello waited its turn.
func TestRegisterCostIndependentOfSize(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	long := strings.Repeat("m", 240)
	w0 := wchar(t)
	for i := range n {
		if _, err := r.Register(rawNS(fmt.Sprintf("%s-%d", long, i), 4096)); err != nil {
			t.Fatal(err)
		}
	}
	written := wchar(t) - w0
	// What the registry holds, once: the bound is a few times that.
	var held int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			held += fi.Size()
		}
	}
	t.Logf("%d registrations wrote %d KiB; the registry's files hold %d KiB", n, written>>10, held>>10)
	if written > 8*held {
		t.Fatalf("%d registrations wrote %d KiB, %.0fx what the registry holds (%d KiB): each rewrites it whole",
			n, written>>10, float64(written)/float64(held), held>>10)
	}
	// And all of it comes back.
	r2, err := OpenRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(r2.All()); got != n {
		t.Fatalf("reopened registry holds %d namespaces, want %d", got, n)
	}
}
