package nvme

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDamagedTableMovedAside: a Badger table (.sst) the MANIFEST lists but
// whose footer is damaged (a torn or zeroed file after a power loss, a
// bad sector) is a corrupt store, moved aside like a damaged MANIFEST.
// Badger opens its tables on goroutines of its own and panics on such a
// footer there (slice bounds out of range), out of reach of openDB's
// recover: kvtierd died at every start. The open runs in a child process.
func TestDamagedTableMovedAside(t *testing.T) {
	for _, tt := range []struct {
		name   string
		damage func(path string, size int64) error
	}{
		{"zeroed", func(p string, size int64) error { return os.WriteFile(p, make([]byte, size), 0o600) }},
		{"torn", func(p string, size int64) error { return os.Truncate(p, size/2) }},
		{"stub", func(p string, _ int64) error { return os.Truncate(p, 3) }},
		{"garbage", func(p string, _ int64) error {
			return os.WriteFile(p, bytes.Repeat([]byte("garbage!"), 4), 0o600)
		}},
		// A damaged first block, footer and index intact: badger's Open
		// reads neither it nor its checksum, and reindex's iteration
		// panicked on its entry offsets.
		{"block", func(p string, size int64) error {
			if size < 16<<10 {
				return fmt.Errorf("table of %d bytes: too small to damage a block before its index", size)
			}
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt(bytes.Repeat([]byte("x"), 3000), 1000)
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "nvme")
			s := openT(t, dir, 64<<20)
			for i := range uint64(300) {
				k := testKey(1, i)
				if err := s.Put(k, payloadFor(k, 4096)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
			if len(tables) == 0 {
				t.Fatal("no table written")
			}
			for _, p := range tables {
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := tt.damage(p, fi.Size()); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=opendamaged", "KVTIER_NVME_DIR="+dir)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				msg := stderr.String()
				if i := strings.Index(msg, "\ngoroutine "); i > 0 {
					msg = msg[:i] // the crash's first lines say what it was
				}
				t.Fatalf("open of a store with a %s table: child exited with %v:\n%s", tt.name, err, msg)
			}
			if got, want := strings.TrimSpace(stdout.String()), "ok moved=true blocks=0"; got != want {
				t.Fatalf("open of a store with a %s table: %q, want %q", tt.name, got, want)
			}
			if m, _ := filepath.Glob(dir + ".corrupt-*"); len(m) != 1 {
				t.Fatalf("moved-aside directories %v, want one", m)
			}
		})
	}
}

// openDamaged opens the store in dir, reports whether it was moved aside
// and how many blocks it holds, and checks that it works.
func openDamaged(dir string) int {
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: 64 << 20, Logger: quietLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	defer s.Close()
	k := testKey(2, 1)
	if err := s.Put(k, payloadFor(k, 4096)); err != nil {
		fmt.Fprintln(os.Stderr, "put:", err)
		return 1
	}
	dst := make([]byte, 4096)
	if n, err := s.Get(k, dst); err != nil || n != 4096 || !bytes.Equal(dst, payloadFor(k, 4096)) {
		fmt.Fprintln(os.Stderr, "get:", n, err, errors.Is(err, ErrChecksum))
		return 1
	}
	st := s.Stats()
	fmt.Printf("ok moved=%v blocks=%d\n", st.MovedAside != "", st.Blocks-1)
	return 0
}
