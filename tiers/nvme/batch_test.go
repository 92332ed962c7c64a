package nvme

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
)

// TestPutBatch: a batch stores every block exactly as Puts of each would,
// across chunks, aligned or not, over existing keys, and across a restart;
// a malformed batch stores nothing.
func TestPutBatch(t *testing.T) {
	sizesOf := func(n, size int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = size
		}
		return out
	}
	for _, tt := range []struct {
		name    string
		sizes   []int
		first   []int // stored one by one under the same keys first
		wantErr error
		badKeys bool // a key twice
		writes  uint64
	}{
		{name: "aligned, several chunks", sizes: sizesOf(40, 64<<10), writes: 3}, // 16 + 16 + 8 blocks of 1 MiB chunks
		{name: "unaligned sizes", sizes: []int{1, 4097, 70000, 0, 65536 + 7, 3 << 20, 12}},
		{name: "over existing keys", sizes: []int{4096, 65536, 100000, 7}, first: []int{70000, 1, 65536, 2 << 20}},
		{name: "one block", sizes: []int{2 << 20}},
		{name: "empty", sizes: nil},
		{name: "too large", sizes: []int{4096, 64 << 20}, wantErr: ErrTooLarge},
		{name: "a key twice", sizes: []int{4096, 4096}, badKeys: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "nvme")
			s := openT(t, dir, 256<<20)
			defer func() { s.Close() }()
			keys, blocks := keysAndBlocks(3, tt.sizes)
			if tt.badKeys {
				keys[1] = keys[0]
			}
			for i, sz := range tt.first {
				if err := s.Put(keys[i], payloadFor(testKey(9, uint64(i)), sz)); err != nil {
					t.Fatal(err)
				}
			}
			err := s.PutBatch(keys, blocks)
			if tt.wantErr != nil || tt.badKeys {
				if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
					t.Fatalf("PutBatch = %v, want %v", err, tt.wantErr)
				}
				if st := s.Stats(); st.Blocks != 0 || st.Puts != 0 {
					t.Fatalf("a refused batch stored %d blocks (%d puts)", st.Blocks, st.Puts)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if w := s.Stats().SegmentWrites - uint64(len(tt.first)); tt.writes != 0 && w != tt.writes {
				t.Fatalf("%d segment writes for %d blocks, want %d", w, len(keys), tt.writes)
			}
			check := func(when string) {
				var want int64
				for i, sz := range tt.sizes {
					mustGet(t, s, keys[i], sz)
					want += int64(sz)
				}
				if st := s.Stats(); st.Blocks != len(keys) || st.Bytes != want {
					t.Fatalf("%s: %d blocks, %d bytes indexed; want %d, %d", when, st.Blocks, st.Bytes, len(keys), want)
				}
			}
			check("after the batch")
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openT(t, dir, 256<<20)
			check("after a restart")
		})
	}
	if err := (&Store{}).PutBatch(make([]Key, 2), make([][]byte, 1)); err == nil {
		t.Fatal("PutBatch accepted 2 keys for 1 block")
	}
}

// TestPutBatchEvictsOthers: a batch that overflows the budget evicts the
// least recently used blocks, never one of its own, and stays within it.
func TestPutBatchEvictsOthers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nvme")
	s := openT(t, dir, MinCapacity)
	defer s.Close()
	const size = 256 << 10
	limit := s.Stats().LogicalLimit
	n := int(limit / (size + blockOverhead))
	for i := range n {
		k := testKey(1, uint64(i))
		if err := s.Put(k, payloadFor(k, size)); err != nil {
			t.Fatal(err)
		}
	}
	keys := make([]Key, n/2)
	blocks := make([][]byte, n/2)
	for i := range keys {
		keys[i] = testKey(2, uint64(i))
		blocks[i] = payloadFor(keys[i], size)
	}
	if err := s.PutBatch(keys, blocks); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		mustGet(t, s, k, size)
	}
	st := s.Stats()
	if st.Evictions == 0 || st.Bytes+int64(st.Blocks)*blockOverhead > limit {
		t.Fatalf("%d evictions, %d bytes in %d blocks, limit %d", st.Evictions, st.Bytes, st.Blocks, limit)
	}
	if s.Contains(testKey(1, 0)) || !s.Contains(testKey(1, uint64(n-1))) {
		t.Fatal("the batch did not evict the least recently used blocks first")
	}
}

// keysAndBlocks returns keys testKey(ns, i) and their payloads of sizes[i].
func keysAndBlocks(ns uint32, sizes []int) ([]Key, [][]byte) {
	keys := make([]Key, len(sizes))
	blocks := make([][]byte, len(sizes))
	for i, sz := range sizes {
		keys[i] = testKey(ns, uint64(i))
		blocks[i] = payloadFor(keys[i], sz)
	}
	return keys, blocks
}

// TestPutBatchIf: blocks keep refuses are not stored (across chunks, with
// the other blocks of their chunk stored), and a refused key's older block
// is left as it was.
func TestPutBatchIf(t *testing.T) {
	for _, tt := range []struct {
		name  string
		n     int
		size  int
		leave []int // indexes keep refuses
	}{
		{name: "none refused", n: 4, size: 4096},
		{name: "one of a chunk", n: 4, size: 4096, leave: []int{1}},
		{name: "all", n: 3, size: 4096, leave: []int{0, 1, 2}},
		{name: "across chunks", n: 40, size: 64 << 10, leave: []int{0, 15, 16, 39}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := openT(t, filepath.Join(t.TempDir(), "nvme"), 256<<20)
			defer s.Close()
			sizes := make([]int, tt.n)
			for i := range sizes {
				sizes[i] = tt.size
			}
			keys, blocks := keysAndBlocks(3, sizes)
			old := payloadFor(testKey(9, 0), 100)
			if err := s.Put(keys[0], old); err != nil { // an older block under a key
				t.Fatal(err)
			}
			refused := map[int]bool{}
			for _, i := range tt.leave {
				refused[i] = true
			}
			asked := map[int]int{}
			if done, err := s.PutBatchIf(keys, blocks, func(i int) bool { asked[i]++; return !refused[i] }); err != nil || done != len(keys) {
				t.Fatalf("PutBatchIf: %d of %d keys done, %v", done, len(keys), err)
			}
			var want int64
			for i, k := range keys {
				if asked[i] != 1 {
					t.Fatalf("keep(%d) ran %d times", i, asked[i])
				}
				switch {
				case !refused[i]:
					mustGet(t, s, k, tt.size)
					want += int64(tt.size)
				case i == 0:
					dst := make([]byte, len(old))
					if n, err := s.Get(k, dst); err != nil || n != len(old) || !bytes.Equal(dst, old) {
						t.Fatalf("the refused key's older block: %d bytes, %v", n, err)
					}
					want += int64(len(old))
				case s.Contains(k):
					t.Fatalf("block %d stored though keep refused it", i)
				}
			}
			if st := s.Stats(); st.Bytes != want {
				t.Fatalf("%d bytes indexed, want %d", st.Bytes, want)
			}
		})
	}
}
