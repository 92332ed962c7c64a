package nvme

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

// FuzzDecodeRecord: the index record decoder accepts exactly what encode
// writes. A decoded record re-encodes to the same bytes and its length and
// offset are in range, so the bounds checks built on them cannot overflow.
func FuzzDecodeRecord(f *testing.F) {
	k := testKey(1, 1)
	var kb [keyLen]byte
	encodeKey(&kb, k)
	r := newRecord(&kb, payloadFor(k, 70000))
	r.seg, r.offset = 3, 1<<20
	var b [recordLen]byte
	r.encode(&b)
	f.Add(b[:])
	f.Add(make([]byte, recordLen))
	f.Add(b[:recordLen-1])
	flagged := b
	flagged[5] = 1
	f.Add(flagged[:])
	f.Fuzz(func(t *testing.T, v []byte) {
		r, ok := decodeRecord(v)
		if !ok {
			return
		}
		if r.n < 0 || r.n > maxRecordField || r.offset < 0 || r.offset > maxRecordField {
			t.Fatalf("decoded %+v: length or offset out of range", r)
		}
		var out [recordLen]byte
		r.encode(&out)
		if !bytes.Equal(out[:], v) {
			t.Fatalf("decoded %x as %+v, which encodes to %x", v, r, out)
		}
	})
}

// FuzzDecodeKey: a decoded key re-encodes to the same bytes.
func FuzzDecodeKey(f *testing.F) {
	var kb [keyLen]byte
	encodeKey(&kb, testKey(5, 9))
	f.Add(kb[:])
	f.Add([]byte{prefixMarker})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, ok := decodeKey(b)
		if !ok {
			return
		}
		var out [keyLen]byte
		encodeKey(&out, k)
		if !bytes.Equal(out[:], b) {
			t.Fatalf("decoded %x as %+v, which encodes to %x", b, k, out)
		}
	})
}

// FuzzIndexRecord replaces block a's index record in badger with arbitrary
// bytes, then reads a, at once or after a restart (reindex), with Get or
// with a GetBatch of a and b. Whatever the record says, the read returns
// a's exact bytes or a miss; it may report a
// short buffer only for a length the segment really holds; and block b,
// stored beside it, still reads back intact (a corrupt length must not
// make the store evict to make room for it).
func FuzzIndexRecord(f *testing.F) {
	// a fills whole alignment units, so GetBatch reads it on its batched
	// path (b, unaligned, goes through Get).
	const sizeA, sizeB = 64 << 10, 5000
	ka, kb := testKey(1, 1), testKey(1, 2)
	// recOf is k's true record (checksum of its payload of size bytes)
	// with the length, segment and offset replaced.
	recOf := func(k Key, size int, n int64, seg uint32, off int64) []byte {
		var kbuf [keyLen]byte
		encodeKey(&kbuf, k)
		r := newRecord(&kbuf, payloadFor(k, size))
		r.n, r.seg, r.offset = n, seg, off
		var b [recordLen]byte
		r.encode(&b)
		return b[:]
	}
	// Seeds: plausible records for the first segment (ids start at 1; a
	// is written first, at offset 0), b's record under a's key, lengths
	// past the segment and far past any block, and garbage.
	f.Add(recOf(ka, sizeA, sizeA, 1, 0), false, false)
	f.Add(recOf(ka, sizeA, sizeA, 1, 0), true, true)
	f.Add(recOf(kb, sizeB, sizeB, 1, sizeA), false, true)
	f.Add(recOf(ka, sizeA, sizeA, 1, sizeA), false, true)
	f.Add(recOf(ka, sizeA, 1<<30, 1, 0), false, false)
	f.Add(recOf(ka, sizeA, 1<<40, 1, 0), true, true)
	f.Add(recOf(ka, sizeA, 1<<40, 1, 0), false, false)
	f.Add(recOf(ka, sizeA, sizeA, 1, 1<<40), true, false)
	f.Add(recOf(ka, sizeA, sizeA, 7, 0), false, true)
	f.Add([]byte("not a record"), true, false)
	f.Fuzz(func(t *testing.T, v []byte, restart, batch bool) {
		dir := filepath.Join(t.TempDir(), "nvme")
		s := openT(t, dir, 64<<20)
		defer func() { s.Close() }()
		for _, p := range []struct {
			k    Key
			size int
		}{{ka, sizeA}, {kb, sizeB}} {
			if err := s.Put(p.k, payloadFor(p.k, p.size)); err != nil {
				t.Fatal(err)
			}
		}
		var kbuf [keyLen]byte
		encodeKey(&kbuf, ka)
		if err := s.db.Update(func(txn *badger.Txn) error { return txn.Set(kbuf[:], v) }); err != nil {
			t.Fatal(err)
		}
		if restart {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openT(t, dir, 64<<20)
		}
		dst := alignedBuf(1 << 20)
		var n int
		var err error
		if batch {
			ns, errs := s.GetBatch([]Key{ka, kb}, [][]byte{dst, alignedBuf(sizeB)})
			if errs[1] != nil || ns[1] != sizeB {
				t.Fatalf("GetBatch of the intact neighbour: %d, %v", ns[1], errs[1])
			}
			n, err = ns[0], errs[0]
		} else {
			n, err = s.Get(ka, dst)
		}
		switch {
		case err == nil:
			if !bytes.Equal(dst[:n], payloadFor(ka, sizeA)) {
				t.Fatalf("Get returned %d bytes that are not the block's", n)
			}
		case errors.Is(err, ErrShortBuffer):
			t.Fatalf("Get reported a short buffer for %d bytes, more than the 1 MiB segment space written", n)
		case !errors.Is(err, ErrNotFound):
			t.Fatalf("Get: %v, want the block or a miss", err)
		}
		mustGet(t, s, kb, sizeB)
		if st := s.Stats(); st.Bytes > 64<<20 || st.Evictions != 0 {
			t.Fatalf("after the corrupt record: %d bytes indexed, %d evictions", st.Bytes, st.Evictions)
		}
	})
}
