package nvme

import (
	"bytes"
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTruncatedManifestMovedAside: a MANIFEST cut short (at or inside a
// change set, or missing) still replays, to an older list of tables, and
// badger opened the directory and deleted the tables it no longer lists:
// reindex found a part of the index or none, and removed the segments no
// record pointed into. The whole cache was gone, silently, evidence and
// all. Open must either keep every block or move the directory aside with
// its tables, as for a MANIFEST badger cannot read. A table the MANIFEST
// does not list whose blocks the index holds (an output whose commit a
// crash cut off) is no loss: such a store opens in place.
func TestTruncatedManifestMovedAside(t *testing.T) {
	const perRound, rounds = 300, 2
	// Two clean closes: two tables, each added to the MANIFEST by a change
	// set of its own.
	build := func(t *testing.T, dir string) map[string][]byte {
		for round := range uint64(rounds) {
			s := openT(t, dir, 64<<20)
			for i := range uint64(perRound) {
				k := testKey(1, round*perRound+i)
				if err := s.Put(k, payloadFor(k, 4096)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
		tables := map[string][]byte{}
		paths, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			tables[filepath.Base(p)] = b
		}
		if len(tables) < 2 {
			t.Fatalf("%d tables written, want at least 2", len(tables))
		}
		return tables
	}
	manifest := func(dir string) string { return filepath.Join(dir, "MANIFEST") }
	truncate := func(at func(starts []int64, size int64) int64) func(*testing.T, string) {
		return func(t *testing.T, dir string) {
			b, err := os.ReadFile(manifest(dir))
			if err != nil {
				t.Fatal(err)
			}
			// Change sets follow the 8-byte magic: length, CRC (4 bytes
			// each), body.
			var starts []int64
			for off := int64(8); off+8 <= int64(len(b)); off += 8 + int64(binary.BigEndian.Uint32(b[off:])) {
				starts = append(starts, off)
			}
			if err := os.Truncate(manifest(dir), at(starts, int64(len(b)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tt := range []struct {
		name   string
		damage func(*testing.T, string)
		lost   bool // blocks are lost: the directory must be moved aside
	}{
		{"intact", func(*testing.T, string) {}, false},
		{"magic only", truncate(func([]int64, int64) int64 { return 8 }), true},
		{"inside the first table's change set", truncate(func(s []int64, _ int64) int64 { return s[len(s)-2] + 5 }), true},
		{"before the last change set", truncate(func(s []int64, _ int64) int64 { return s[len(s)-1] }), true},
		{"torn last change set", truncate(func(_ []int64, size int64) int64 { return size - 1 }), true},
		{"removed", func(t *testing.T, dir string) {
			if err := os.Remove(manifest(dir)); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"unlisted copy of a listed table", func(t *testing.T, dir string) {
			b, err := os.ReadFile(filepath.Join(dir, "000001.sst"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "000099.sst"), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "nvme")
			tables := build(t, dir)
			tt.damage(t, dir)
			damaged, _ := os.ReadFile(manifest(dir))
			s := openT(t, dir, 64<<20)
			defer s.Close()
			st := s.Stats()
			hits := 0
			dst := make([]byte, 4096)
			for i := range uint64(rounds * perRound) {
				k := testKey(1, i)
				if n, err := s.Get(k, dst); err == nil {
					if n != 4096 || !bytes.Equal(dst, payloadFor(k, 4096)) {
						t.Fatalf("block %d: wrong bytes", i)
					}
					hits++
				}
			}
			if !tt.lost {
				if st.MovedAside != "" || hits != rounds*perRound {
					t.Fatalf("moved aside %q, %d of %d blocks; want the store opened in place with every block", st.MovedAside, hits, rounds*perRound)
				}
				if _, err := os.Stat(filepath.Join(dir, unlistedDirName)); !os.IsNotExist(err) {
					t.Fatalf("tables set aside during Open left behind: %v", err)
				}
				if _, err := os.Stat(filepath.Join(dir, tornTailName)); !os.IsNotExist(err) {
					t.Fatalf("saved MANIFEST tail left behind: %v", err)
				}
				return
			}
			if st.MovedAside == "" {
				t.Fatalf("opened in place with %d of %d blocks, not moved aside", hits, rounds*perRound)
			}
			if hits != 0 {
				t.Fatalf("moved aside, yet %d blocks read back", hits)
			}
			// The evidence: every table, in the moved-aside directory.
			kept := map[string]bool{}
			filepath.WalkDir(st.MovedAside, func(p string, d fs.DirEntry, err error) error {
				if err == nil && strings.HasSuffix(p, ".sst") {
					b, _ := os.ReadFile(p)
					for name, want := range tables {
						if bytes.Equal(b, want) {
							kept[name] = true
						}
					}
				}
				return nil
			})
			if len(kept) != len(tables) {
				t.Fatalf("moved-aside directory holds %d of the %d tables", len(kept), len(tables))
			}
			// And the MANIFEST as the damage left it: badger trims a torn
			// tail when it opens, so the tail is kept beside it.
			if damaged != nil {
				aside, _ := os.ReadFile(manifest(st.MovedAside))
				tail, _ := os.ReadFile(filepath.Join(st.MovedAside, tornTailName))
				if got := append(aside, tail...); !bytes.Equal(got, damaged) {
					t.Fatalf("moved-aside MANIFEST (%d bytes) and saved tail (%d bytes) are not the damaged MANIFEST (%d bytes)", len(aside), len(tail), len(damaged))
				}
			}
		})
	}
}

// TestCrashImageUnlistedTableOpensInPlace: a crash can leave tables the
// MANIFEST does not list with nothing lost (a table cut short while a
// flush wrote it, badger's log still to replay; a copy of listed records):
// Open keeps the store and every block, and removes them.
func TestCrashImageUnlistedTableOpensInPlace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, 64<<20)
	defer s.Close()
	for i := range uint64(300) {
		k := testKey(1, i)
		if err := s.Put(k, payloadFor(k, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	// The image a kill -9 would leave: the records only in badger's log.
	img := filepath.Join(t.TempDir(), "nvme")
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(img, rel), 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(img, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(img, "*.mem")); len(m) == 0 {
		t.Fatal("no badger log in the crash image")
	}
	if err := os.WriteFile(filepath.Join(img, "000007.sst"), bytes.Repeat([]byte{0}, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := openT(t, img, 64<<20)
	defer s2.Close()
	if st := s2.Stats(); st.MovedAside != "" || st.Blocks != 300 {
		t.Fatalf("moved aside %q, %d blocks; want the store opened in place with 300", st.MovedAside, st.Blocks)
	}
	for i := range uint64(300) {
		mustGet(t, s2, testKey(1, i), 4096)
	}
	if _, err := os.Stat(filepath.Join(img, unlistedDirName)); !os.IsNotExist(err) {
		t.Fatalf("tables set aside during Open left behind: %v", err)
	}
}
