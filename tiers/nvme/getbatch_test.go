package nvme

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

// recordOf returns the index record of k.
func recordOf(t *testing.T, s *Store, k Key) record {
	t.Helper()
	var kb [keyLen]byte
	encodeKey(&kb, k)
	var rec record
	var ok bool
	if err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(kb[:])
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error { rec, ok = decodeRecord(v); return nil })
	}); err != nil || !ok {
		t.Fatalf("record of %v: %v (decoded %v)", k, err, ok)
	}
	return rec
}

// flipPayloadByte corrupts one byte of k's payload in its segment file.
func flipPayloadByte(t *testing.T, s *Store, k Key) {
	t.Helper()
	rec := recordOf(t, s, k)
	f, err := os.OpenFile(filepath.Join(s.segs.dir, segName(rec.seg)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	off := rec.offset + rec.n/2
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestGetBatch: a batch reads back every block exactly as Get would, in
// one read per run of back-to-back records where the records and buffers
// allow it, and reports misses, short buffers and corrupt blocks per
// block.
func TestGetBatch(t *testing.T) {
	const kib64 = 64 << 10
	for _, tt := range []struct {
		name      string
		sizes     []int // stored with one PutBatch, keys testKey(4, i)
		ask       []int // indexes read (in this order); -1 is a key never stored
		shuffle   bool
		unaligned map[int]bool // buffers for these positions of ask start one byte off
		short     map[int]bool // buffers one byte short
		corrupt   []int        // sizes indexes whose payload is damaged on disk
		reads     int          // segment reads expected (0: not checked)
		restart   bool
	}{
		{name: "one run per MiB", sizes: fill(40, kib64), ask: seq(40), reads: 3},
		{name: "shuffled order", sizes: fill(40, kib64), ask: seq(40), shuffle: true, reads: 3},
		{name: "after a restart", sizes: fill(16, kib64), ask: seq(16), reads: 1, restart: true},
		{name: "gaps split runs", sizes: fill(12, kib64), ask: []int{0, 1, 2, 5, 6, 11}, reads: 3},
		{name: "2 MiB blocks", sizes: fill(3, 2<<20), ask: seq(3), reads: 3},
		{name: "misses mixed in", sizes: fill(8, kib64), ask: []int{-1, 0, 1, -1, 2, 3, -1}, reads: 1},
		{name: "short buffer", sizes: fill(4, kib64), ask: seq(4), short: map[int]bool{2: true}, reads: 2},
		{name: "unaligned buffer", sizes: fill(4, kib64), ask: seq(4), unaligned: map[int]bool{1: true}, reads: 3},
		{name: "unaligned sizes", sizes: []int{1, 4097, 70000, 0, kib64 + 7, 12}, ask: seq(6)},
		{name: "corrupt block in a run", sizes: fill(8, kib64), ask: seq(8), corrupt: []int{3}, reads: 1},
		{name: "the same key twice", sizes: fill(2, kib64), ask: []int{0, 1, 0}},
		{name: "empty", ask: nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "nvme")
			s := openT(t, dir, 256<<20)
			defer func() { s.Close() }()
			keys, blocks := keysAndBlocks(4, tt.sizes)
			if err := s.PutBatch(keys, blocks); err != nil {
				t.Fatal(err)
			}
			for _, i := range tt.corrupt {
				flipPayloadByte(t, s, keys[i])
			}
			if tt.restart {
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				dropCache(t, dir)
				s = openT(t, dir, 256<<20)
			}
			ask := append([]int(nil), tt.ask...)
			if tt.shuffle {
				rand.New(rand.NewPCG(1, 2)).Shuffle(len(ask), func(a, b int) { ask[a], ask[b] = ask[b], ask[a] })
			}
			askKeys := make([]Key, len(ask))
			dsts := make([][]byte, len(ask))
			for j, i := range ask {
				size := 4096
				if i >= 0 {
					askKeys[j], size = keys[i], tt.sizes[i]
				} else {
					askKeys[j] = testKey(8, uint64(j))
				}
				if tt.short[j] {
					size--
				}
				dsts[j] = alignedBuf(size + 1)[:size]
				if tt.unaligned[j] {
					dsts[j] = alignedBuf(size + 1)[1:]
				}
			}
			before := s.Stats()
			ns, errs := s.GetBatch(askKeys, dsts)
			after := s.Stats()
			hits := 0
			for j, i := range ask {
				switch {
				case i < 0:
					if !errors.Is(errs[j], ErrNotFound) {
						t.Errorf("never stored, position %d: %v", j, errs[j])
					}
				case tt.short[j]:
					if !errors.Is(errs[j], ErrShortBuffer) || ns[j] != tt.sizes[i] {
						t.Errorf("short buffer, position %d: %d, %v", j, ns[j], errs[j])
					}
				case slices.Contains(tt.corrupt, i):
					if !errors.Is(errs[j], ErrNotFound) || !errors.Is(errs[j], ErrChecksum) {
						t.Errorf("corrupt block %d: %d, %v; want a checksum miss", i, ns[j], errs[j])
					}
					if s.Contains(keys[i]) {
						t.Errorf("corrupt block %d still indexed", i)
					}
				default:
					if errs[j] != nil || ns[j] != tt.sizes[i] || !bytes.Equal(dsts[j][:ns[j]], blocks[i]) {
						t.Errorf("block %d (position %d): n=%d err=%v equal=%v", i, j, ns[j], errs[j], errs[j] == nil && bytes.Equal(dsts[j][:ns[j]], blocks[i]))
					}
					hits++
				}
			}
			if got := after.Hits - before.Hits; got != uint64(hits) {
				t.Errorf("%d hits counted, want %d", got, hits)
			}
			if got := after.ChecksumMisses - before.ChecksumMisses; got != uint64(len(tt.corrupt)) {
				t.Errorf("%d checksum misses, want %d", got, len(tt.corrupt))
			}
			// A corrupt block of a run is read once in the run and once
			// again alone by Get.
			if got := after.SegmentReads - before.SegmentReads; tt.reads != 0 && directSegments(s) && got != uint64(tt.reads+len(tt.corrupt)) {
				t.Errorf("%d segment reads, want %d", got, tt.reads+len(tt.corrupt))
			}
		})
	}
	s := &Store{}
	if _, errs := s.GetBatch(make([]Key, 2), make([][]byte, 1)); errs[0] == nil || errs[1] == nil {
		t.Fatal("GetBatch accepted 2 keys for 1 buffer")
	}
}

// TestGetBatchClosed: a closed store fails every block with ErrClosed.
func TestGetBatchClosed(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), "nvme"), 256<<20)
	k := testKey(1, 1)
	if err := s.Put(k, payloadFor(k, 4096)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, errs := s.GetBatch([]Key{k, k}, [][]byte{make([]byte, 4096), make([]byte, 4096)})
	for i, err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("block %d of a closed store: %v", i, err)
		}
	}
}

// directSegments reports whether the store's segment files use direct
// I/O (a filesystem without O_DIRECT, such as tmpfs, reads everything
// through the page cache, where GetBatch coalesces regardless of buffer
// alignment).
func directSegments(s *Store) bool {
	segs := s.segs.snapshot()
	return len(segs) > 0 && segs[0].direct
}

func fill(n, size int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = size
	}
	return out
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
