package nvme

// GetBatch against Get against the bytes put, over sizes and buffers at the
// edges of the direct-I/O alignment, and the buffered fallback segments.

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// alignedAt returns a buffer of length n whose first byte lies misalign
// bytes past a 4096-byte boundary, with extra sentinel bytes (0xA5) after
// it up to its capacity, so a write past len shows.
func alignedAt(n, misalign, slack int) []byte {
	raw := make([]byte, n+misalign+slack+8192)
	off := (4096 - int(uintptr(unsafe.Pointer(&raw[0]))%4096)) % 4096
	b := raw[off+misalign : off+misalign+n+slack]
	for i := range b {
		b[i] = 0xA5
	}
	return b[: n : n+slack]
}

func edgeSizes() []int {
	return []int{0, 1, 511, 512, 513, 4095, 4096, 4097, 8192, 64<<10 - 1, 64 << 10, 64<<10 + 1, 1<<20 - 1, 1 << 20, 1<<20 + 1}
}

func randMisalign(r *rand.Rand) int {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return 512
	case 2:
		return r.IntN(16)
	default:
		return r.IntN(4096)
	}
}

// randLen returns a dst length for a block of size (or of a missing key).
func randLen(r *rand.Rand, size int) int {
	switch r.IntN(7) {
	case 0:
		return size
	case 1:
		return size + 1
	case 2:
		return (size + 4095) / 4096 * 4096
	case 3:
		return size + 4096
	case 4:
		if size > 0 {
			return size - 1 // short buffer
		}
		return 0
	case 5:
		return size + r.IntN(8192)
	default:
		return r.IntN(size + 1)
	}
}

type readResult struct {
	n        int
	notFound bool
	short    bool
	err      error
}

func classify(n int, err error) readResult {
	return readResult{n: n, notFound: errors.Is(err, ErrNotFound), short: errors.Is(err, ErrShortBuffer), err: err}
}

func (a readResult) same(b readResult) bool {
	if (a.err == nil) != (b.err == nil) || a.notFound != b.notFound || a.short != b.short {
		return false
	}
	if a.err == nil || a.short {
		return a.n == b.n
	}
	return true
}

func diffGetBatch(t *testing.T, dir string, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x5555))
	s := openT(t, dir, 512<<20)
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	sizes := edgeSizes()
	want := map[Key][]byte{}
	var keys []Key
	// Put every size several times from buffers of random alignment,
	// singly and in batches.
	next := uint64(1)
	for round := 0; round < 8; round++ {
		var bk []Key
		var bb [][]byte
		for _, size := range sizes {
			k := testKey(9, next)
			next++
			src := alignedAt(size, randMisalign(r), 64)
			fillFor(k, src)
			want[k] = bytes.Clone(src)
			keys = append(keys, k)
			if r.IntN(2) == 0 {
				if err := s.Put(k, src); err != nil {
					t.Fatalf("Put %d: %v", size, err)
				}
			} else {
				bk = append(bk, k)
				bb = append(bb, src)
			}
		}
		r.Shuffle(len(bk), func(i, j int) { bk[i], bk[j] = bk[j], bk[i]; bb[i], bb[j] = bb[j], bb[i] })
		if err := s.PutBatch(bk, bb); err != nil {
			t.Fatalf("PutBatch: %v", err)
		}
	}
	// Overwrite a few with a different size.
	for i := 0; i < 5; i++ {
		k := keys[r.IntN(len(keys))]
		size := sizes[r.IntN(len(sizes))]
		src := alignedAt(size, randMisalign(r), 0)
		fillFor(k, src)
		if err := s.Put(k, src); err != nil {
			t.Fatal(err)
		}
		want[k] = bytes.Clone(src)
	}
	check := func(phase string) {
		for iter := 0; iter < 40; iter++ {
			nb := 1 + r.IntN(24)
			bk := make([]Key, nb)
			for i := range bk {
				switch x := r.IntN(10); {
				case x == 0:
					bk[i] = testKey(9, 1_000_000+uint64(r.IntN(100))) // miss
				case x == 1 && i > 0:
					bk[i] = bk[r.IntN(i)] // duplicate
				case x < 5 && i > 0:
					// the next key put after the previous one (likely adjacent on disk)
					bk[i] = keys[(slicesIndex(keys, bk[i-1])+1+len(keys))%len(keys)]
				default:
					bk[i] = keys[r.IntN(len(keys))]
				}
			}
			d1 := make([][]byte, nb)
			d2 := make([][]byte, nb)
			for i, k := range bk {
				size := len(want[k])
				l, m := randLen(r, size), randMisalign(r)
				d1[i] = alignedAt(l, m, 4096)
				d2[i] = alignedAt(l, m, 4096)
			}
			ns, errs := s.GetBatch(bk, d1)
			for i, k := range bk {
				g := classify(s.Get(k, d2[i]))
				b := classify(ns[i], errs[i])
				w, ok := want[k]
				var exp readResult
				switch {
				case !ok:
					exp = readResult{notFound: true, err: ErrNotFound}
				case len(d1[i]) < len(w):
					exp = readResult{n: len(w), short: true, err: ErrShortBuffer}
				default:
					exp = readResult{n: len(w)}
				}
				if !b.same(exp) || !g.same(exp) {
					t.Fatalf("%s iter %d key %d (size %d, dst len %d misalign %d): GetBatch (%d, %v), Get (%d, %v), want (%d, %v)",
						phase, iter, i, len(w), len(d1[i]), uintptr(unsafe.Pointer(unsafe.SliceData(d1[i])))%4096, b.n, b.err, g.n, g.err, exp.n, exp.err)
				}
				for j, d := range [][]byte{d1[i], d2[i]} {
					if exp.err == nil && !bytes.Equal(d[:exp.n], w) {
						t.Fatalf("%s: %s returned wrong bytes for key %d (size %d, dst %d)", phase, []string{"GetBatch", "Get"}[j], i, len(w), len(d))
					}
					full := d[:cap(d)]
					if exp.err == nil || exp.notFound {
						for x := exp.n; x < len(full); x++ {
							if full[x] != 0xA5 {
								t.Fatalf("%s: %s wrote byte %d past the block (size %d, dst len %d)", phase, []string{"GetBatch", "Get"}[j], x, len(w), len(d))
							}
						}
					} else {
						for x := len(d); x < len(full); x++ {
							if full[x] != 0xA5 {
								t.Fatalf("%s: %s wrote byte %d past dst (size %d, dst len %d)", phase, []string{"GetBatch", "Get"}[j], x, len(w), len(d))
							}
						}
					}
				}
			}
		}
	}
	check("fresh")
	st := s.Stats()
	if st.ChecksumMisses != 0 {
		t.Fatalf("checksum misses: %d", st.ChecksumMisses)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	s = openT(t, dir, 512<<20)
	closed = false
	check("reopened")
	if st := s.Stats(); st.ChecksumMisses != 0 {
		t.Fatalf("checksum misses after reopen: %d", st.ChecksumMisses)
	}
	t.Logf("direct segments: %v, offAlign %d memAlign %d, stats %+v", directSegments(s), s.segs.offAlign, s.segs.memAlign, s.Stats())
}

func slicesIndex(ks []Key, k Key) int {
	for i, x := range ks {
		if x == k {
			return i
		}
	}
	return 0
}

func TestGetBatchDifferential(t *testing.T) {
	dirs := map[string]string{"default": t.TempDir()}
	for name, root := range map[string]string{"tmpfs": "/tmp/tmpfs-nvme"} {
		if fi, err := os.Stat(root); err == nil && fi.IsDir() {
			d, err := os.MkdirTemp(root, "audit")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(d) })
			dirs[name] = d
		}
	}
	for name, dir := range dirs {
		for seed := uint64(1); seed <= 1; seed++ {
			t.Run(fmt.Sprintf("%s/%d", name, seed), func(t *testing.T) {
				diffGetBatch(t, filepath.Join(dir, fmt.Sprint(seed)), seed)
			})
		}
	}
}

// TestBufferedSegmentFallback drives the segment layer on a filesystem that
// refuses O_DIRECT (ramfs; its statfs reports no free space, so a whole
// Store refuses Puts there): appends from buffers of every alignment and
// length, read back through read (Get's path) and readSegment (GetBatch's).
func TestBufferedSegmentFallback(t *testing.T) {
	// ramfs refuses O_DIRECT (on this kernel tmpfs accepts it).
	dir := filepath.Join(t.TempDir(), "ramfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
		t.Skipf("cannot mount ramfs (needs root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	ss, err := openSegStore(dir, 64<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.closeAll()
	r := rand.New(rand.NewPCG(7, 7))
	type rec struct {
		seg  uint32
		off  int64
		data []byte
		kb   [keyLen]byte
		r    record
	}
	var recs []rec
	for round := 0; round < 4; round++ {
		var ps [][]byte
		for _, size := range edgeSizes() {
			p := alignedAt(size, randMisalign(r), 0)
			for i := range p {
				p[i] = byte(r.Uint32())
			}
			ps = append(ps, p)
		}
		offs := make([]int64, len(ps))
		seg, err := ss.appendMany(ps, offs)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range ps {
			var kb [keyLen]byte
			encodeKey(&kb, testKey(3, uint64(len(recs))))
			rc := newRecord(&kb, p)
			rc.seg, rc.offset = seg, offs[i]
			recs = append(recs, rec{seg, offs[i], bytes.Clone(p), kb, rc})
		}
	}
	for _, sg := range ss.snapshot() {
		if sg.direct {
			t.Fatalf("segment %d direct on ramfs", sg.id)
		}
	}
	for _, rc := range recs {
		for try := 0; try < 4; try++ {
			d := alignedAt(len(rc.data)+r.IntN(3)*4096, randMisalign(r), 4096)
			if err := ss.read(rc.seg, rc.off, int64(len(rc.data)), d); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(d[:len(rc.data)], rc.data) {
				t.Fatalf("read of %d bytes: wrong bytes", len(rc.data))
			}
		}
	}
	s := &Store{segs: ss}
	prs := make([]pendingRead, len(recs))
	dsts := make([][]byte, len(recs))
	for i, rc := range recs {
		prs[i] = pendingRead{i: i, kb: rc.kb, rec: rc.r}
		dsts[i] = alignedAt(len(rc.data)+r.IntN(2), randMisalign(r), 0)
	}
	ns := make([]int, len(recs))
	slow := s.readSegment(prs, dsts, ns, nil)
	isSlow := map[int]bool{}
	for _, i := range slow {
		isSlow[i] = true
	}
	for i, rc := range recs {
		if isSlow[i] {
			continue
		}
		if ns[i] != len(rc.data) || !bytes.Equal(dsts[i][:ns[i]], rc.data) {
			t.Fatalf("readSegment record %d (%d bytes): n %d, bytes equal %v", i, len(rc.data), ns[i], bytes.Equal(dsts[i][:len(rc.data)], rc.data))
		}
	}
	t.Logf("%d records, %d left to Get", len(recs), len(slow))
}
