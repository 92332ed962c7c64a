package nvme

import (
	"encoding/binary"

	"github.com/kvtier/kvtier/shm"
	"github.com/zeebo/xxh3"
)

// Key identifies a block: namespace id plus the chained 128-bit hash.
type Key struct {
	NS   uint32
	Hash shm.Hash
}

const (
	prefixBlock  = 0x01 // block keys: prefixBlock | ns (BE) | hash.Hi (BE) | hash.Lo (BE)
	prefixMarker = 0xFE // maintenance marker, written and dropped to force a memtable flush

	keyLen = 1 + 4 + 16

	// HeaderSize is the size of the index record badger stores per block
	// (the payload itself lives in a segment file).
	HeaderSize = recordLen

	formatVersion = 2
)

var magic = [4]byte{'k', 'v', 't', 'I'}

func encodeKey(b *[keyLen]byte, k Key) {
	b[0] = prefixBlock
	binary.BigEndian.PutUint32(b[1:5], k.NS)
	binary.BigEndian.PutUint64(b[5:13], k.Hash.Hi)
	binary.BigEndian.PutUint64(b[13:21], k.Hash.Lo)
}

func decodeKey(b []byte) (Key, bool) {
	if len(b) != keyLen || b[0] != prefixBlock {
		return Key{}, false
	}
	return Key{
		NS: binary.BigEndian.Uint32(b[1:5]),
		Hash: shm.Hash{
			Hi: binary.BigEndian.Uint64(b[5:13]),
			Lo: binary.BigEndian.Uint64(b[13:21]),
		},
	}, true
}

// checksum covers the key, the first 16 header bytes (magic, version,
// flags, length) and the payload, so a value that is intact but stored
// under — or pointed at by — another key also fails verification.
func checksum(kb *[keyLen]byte, hdr []byte, payload []byte) xxh3.Uint128 {
	var seedBuf [keyLen + 16]byte
	copy(seedBuf[:keyLen], kb[:])
	copy(seedBuf[keyLen:], hdr[:16])
	return xxh3.Hash128Seed(payload, xxh3.Hash(seedBuf[:]))
}

// The index record badger stores under a block's key (recLen bytes):
//
//	off size field
//	0   4    magic "kvtI"
//	4   1    format version (2)
//	5   1    flags (0)
//	6   2    reserved (0)
//	8   8    payload length, uint64 little-endian
//	16  16   XXH3-128 (Hi, Lo; LE) of payload, seeded with XXH3-64 of
//	         (key ‖ record[0:16])
//	32  4    segment id, uint32 LE
//	36  4    reserved (0)
//	40  8    offset of the payload in the segment, uint64 LE
const recordLen = 48

type record struct {
	n      int64
	sumHi  uint64
	sumLo  uint64
	seg    uint32
	offset int64
}

// newRecord computes the checksum of payload under kb (location unset).
func newRecord(kb *[keyLen]byte, payload []byte) record {
	var b [recordLen]byte
	r := record{n: int64(len(payload))}
	r.encode(&b)
	sum := checksum(kb, b[:16], payload)
	r.sumHi, r.sumLo = sum.Hi, sum.Lo
	return r
}

// encode writes the record into b.
func (r record) encode(b *[recordLen]byte) {
	*b = [recordLen]byte{}
	copy(b[0:4], magic[:])
	b[4] = formatVersion
	binary.LittleEndian.PutUint64(b[8:16], uint64(r.n))
	binary.LittleEndian.PutUint64(b[16:24], r.sumHi)
	binary.LittleEndian.PutUint64(b[24:32], r.sumLo)
	binary.LittleEndian.PutUint32(b[32:36], r.seg)
	binary.LittleEndian.PutUint64(b[40:48], uint64(r.offset))
}

// maxRecordField bounds a record's length and offset: far above any
// segment (under 1 GiB), and low enough that offset + length cannot
// overflow in the bounds checks of reindex and Get.
const maxRecordField = 1 << 40

// decodeRecord accepts exactly what encode writes: flags and reserved
// bytes zero, length and offset within maxRecordField. Anything else is a
// corrupt record (a miss), not a block to read.
func decodeRecord(v []byte) (record, bool) {
	if len(v) != recordLen || [4]byte(v[0:4]) != magic || v[4] != formatVersion ||
		v[5] != 0 || v[6] != 0 || v[7] != 0 || [4]byte(v[36:40]) != [4]byte{} {
		return record{}, false
	}
	r := record{
		n:      int64(binary.LittleEndian.Uint64(v[8:16])),
		sumHi:  binary.LittleEndian.Uint64(v[16:24]),
		sumLo:  binary.LittleEndian.Uint64(v[24:32]),
		seg:    binary.LittleEndian.Uint32(v[32:36]),
		offset: int64(binary.LittleEndian.Uint64(v[40:48])),
	}
	if r.n < 0 || r.offset < 0 || r.n > maxRecordField || r.offset > maxRecordField {
		return record{}, false
	}
	return r, true
}

// verify checks payload (already copied to the caller's memory) against r.
func (r record) verify(kb *[keyLen]byte, payload []byte) bool {
	var hdr [16]byte
	copy(hdr[0:4], magic[:])
	hdr[4] = formatVersion
	binary.LittleEndian.PutUint64(hdr[8:16], uint64(len(payload)))
	sum := checksum(kb, hdr[:], payload)
	return int64(len(payload)) == r.n && sum.Hi == r.sumHi && sum.Lo == r.sumLo
}
