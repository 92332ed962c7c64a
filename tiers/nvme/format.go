package nvme

import (
	"encoding/binary"
	"errors"

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

	// HeaderSize is the size of the header stored in front of every block.
	HeaderSize = 32

	formatVersion = 1
)

var magic = [4]byte{'k', 'v', 't', 'B'}

var errCorrupt = errors.New("block failed verification")

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

// encodeValue writes header+payload into dst (len ≥ HeaderSize+len(payload)).
func encodeValue(dst []byte, kb *[keyLen]byte, payload []byte) []byte {
	v := dst[:HeaderSize+len(payload)]
	copy(v[0:4], magic[:])
	v[4] = formatVersion
	v[5] = 0
	v[6], v[7] = 0, 0
	binary.LittleEndian.PutUint64(v[8:16], uint64(len(payload)))
	copy(v[HeaderSize:], payload)
	sum := checksum(kb, v[:16], v[HeaderSize:])
	binary.LittleEndian.PutUint64(v[16:24], sum.Hi)
	binary.LittleEndian.PutUint64(v[24:32], sum.Lo)
	return v
}

// decodeInto copies the payload of the stored value v into dst and verifies
// it there (copy first, then check the copy: the source is an mmap of a
// file that anything may have scribbled on). It returns the payload length.
// On error the contents of dst are unspecified.
func decodeInto(kb *[keyLen]byte, v []byte, dst []byte) (int, error) {
	if len(v) < HeaderSize {
		return 0, errCorrupt
	}
	var hdr [HeaderSize]byte
	copy(hdr[:], v[:HeaderSize])
	if [4]byte(hdr[0:4]) != magic || hdr[4] != formatVersion {
		return 0, errCorrupt
	}
	n64 := binary.LittleEndian.Uint64(hdr[8:16])
	if n64 != uint64(len(v)-HeaderSize) {
		return 0, errCorrupt // torn or length-corrupted value
	}
	n := int(n64)
	if n > len(dst) {
		return n, errShort
	}
	copy(dst[:n], v[HeaderSize:])
	sum := checksum(kb, hdr[:16], dst[:n])
	if sum.Hi != binary.LittleEndian.Uint64(hdr[16:24]) || sum.Lo != binary.LittleEndian.Uint64(hdr[24:32]) {
		return 0, errCorrupt
	}
	return n, nil
}

var errShort = errors.New("short buffer")

// sizeFromValueSize recovers the exact payload size from badger's
// Item.ValueSize for a value stored in the value log, without reading it.
//
// Badger computes ValueSize = vp.Len - (len(key)+8) - 6 - 4, where vp.Len
// is the length of the value-log entry: header (meta, userMeta,
// uvarint(klen), uvarint(vlen), uvarint(expiresAt)) + key with timestamp +
// value + crc32. For our keys (21 bytes + 8 ts → klen 29, one varint byte)
// and expiresAt 0 (one byte), vp.Len = 4 + uvarintLen(vlen) + 29 + vlen + 4,
// hence ValueSize = vlen + uvarintLen(vlen) - 2. TestReindexExactSizes pins
// this against the badger version in go.mod; if a size cannot be solved the
// caller falls back to the approximation and Get corrects it.
func sizeFromValueSize(vs int64) (int64, bool) {
	for u := int64(1); u <= 10; u++ {
		vlen := vs + 2 - u
		if vlen < HeaderSize {
			continue
		}
		if int64(uvarintLen(uint64(vlen))) == u {
			return vlen - HeaderSize, true
		}
	}
	return 0, false
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}
