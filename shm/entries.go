package shm

import (
	"encoding/binary"
	"fmt"
)

// Op is a ring operation code.
type Op uint8

const (
	OpLookup  Op = 1 // Buf/Count: Count hashes (16 B each) at Buf; the daemon writes Count tier bytes after them. Value = leading hits.
	OpReserve Op = 2 // Hash → Token (reservation), Offset (arena slot)
	OpCommit  Op = 3 // Token of a reservation
	OpAbort   Op = 4 // Token of a reservation
	OpAcquire Op = 5 // Hash → Token (lease), Offset, Tier
	OpRelease Op = 6 // Token of a lease
	OpDelete  Op = 7 // Hash
	OpNop     Op = 8 // completes at once; measures the ring round trip
	opMax        = OpNop
)

func (o Op) Valid() bool { return o >= OpLookup && o <= opMax }

func (o Op) String() string {
	names := [...]string{"invalid", "lookup", "reserve", "commit", "abort", "acquire", "release", "delete", "nop"}
	if int(o) < len(names) {
		return names[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Status is a completion's result code.
type Status uint32

const (
	StatusOK         Status = 0
	StatusNotFound   Status = 1 // miss
	StatusExists     Status = 2 // duplicate put: already present or being written
	StatusFull       Status = 3 // tier full of leased/reserved blocks
	StatusNoToken    Status = 4 // commit/abort/release of a token this session does not hold
	StatusBadRequest Status = 5
	StatusInternal   Status = 6
	StatusClosing    Status = 7 // daemon is shutting down
)

func (s Status) String() string {
	names := [...]string{"ok", "not found", "exists", "tier full", "no such reservation or lease", "bad request", "internal error", "daemon closing"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("status(%d)", uint32(s))
}

// SQEFlagParked addresses the blocks of a parked request instead of
// prefix-chained blocks: Hash is {request id, block index}. Valid on
// reserve, acquire and delete.
const SQEFlagParked = 1 << 0

// FlagsValid reports whether flags are allowed on op.
func (o Op) FlagsValid(flags uint8) bool {
	switch o {
	case OpReserve, OpAcquire:
		return flags&^(SQEFlagParked|SQEFlagDevice) == 0
	case OpDelete:
		return flags&^SQEFlagParked == 0
	}
	return flags == 0
}

// SQESize and CQESize are the fixed entry sizes.
const (
	SQESize = 64
	CQESize = 32
	// LookupKeySize is the bytes per hash in a lookup's data-area buffer;
	// each key also needs one result byte.
	LookupKeySize = 16
)

// SQE is a submission entry: client → daemon, untrusted by the daemon.
//
//	0 op u8 | 1 flags u8 | 2 reserved u16 | 4 count u32 | 8 user_data u64
//	16 hash hi u64 | 24 hash lo u64 | 32 token u64 | 40 buf u32 | 44 buf_len u32
//	48..63 reserved
type SQE struct {
	Op       Op
	Flags    uint8
	Count    uint32
	UserData uint64
	Hash     Hash
	Token    uint64
	Buf      uint32
	BufLen   uint32
}

// Encode writes e into b (len ≥ SQESize).
func (e *SQE) Encode(b []byte) {
	_ = b[SQESize-1]
	b[0] = byte(e.Op)
	b[1] = e.Flags
	binary.LittleEndian.PutUint16(b[2:], 0)
	binary.LittleEndian.PutUint32(b[4:], e.Count)
	binary.LittleEndian.PutUint64(b[8:], e.UserData)
	binary.LittleEndian.PutUint64(b[16:], e.Hash.Hi)
	binary.LittleEndian.PutUint64(b[24:], e.Hash.Lo)
	binary.LittleEndian.PutUint64(b[32:], e.Token)
	binary.LittleEndian.PutUint32(b[40:], e.Buf)
	binary.LittleEndian.PutUint32(b[44:], e.BufLen)
	clear(b[48:SQESize])
}

// Decode reads e from b (len ≥ SQESize). Every field is read exactly once;
// validation happens on the decoded copy (see CheckBuf and the daemon).
func (e *SQE) Decode(b []byte) {
	_ = b[SQESize-1]
	e.Op = Op(b[0])
	e.Flags = b[1]
	e.Count = binary.LittleEndian.Uint32(b[4:])
	e.UserData = binary.LittleEndian.Uint64(b[8:])
	e.Hash.Hi = binary.LittleEndian.Uint64(b[16:])
	e.Hash.Lo = binary.LittleEndian.Uint64(b[24:])
	e.Token = binary.LittleEndian.Uint64(b[32:])
	e.Buf = binary.LittleEndian.Uint32(b[40:])
	e.BufLen = binary.LittleEndian.Uint32(b[44:])
}

// LookupSpan validates a lookup entry against a data area of dataLen bytes
// and returns the byte ranges of its keys and of its results. The arithmetic
// is done in 64 bits so no peer-chosen value can wrap it.
func (e *SQE) LookupSpan(dataLen int) (keys, results [2]int, err error) {
	if e.Count == 0 {
		return keys, results, fmt.Errorf("lookup with zero keys")
	}
	need := uint64(e.Count) * (LookupKeySize + 1)
	end := uint64(e.Buf) + uint64(e.BufLen)
	if dataLen < 0 || need > uint64(e.BufLen) || end > uint64(dataLen) {
		return keys, results, fmt.Errorf("lookup buffer [%d,+%d) for %d keys outside data area of %d bytes", e.Buf, e.BufLen, e.Count, dataLen)
	}
	k0 := int(e.Buf)
	k1 := k0 + int(e.Count)*LookupKeySize
	return [2]int{k0, k1}, [2]int{k1, k1 + int(e.Count)}, nil
}

// CQEFlagPromoted marks an acquire that was served by promoting the block
// from a slower tier (a swap-in).
const CQEFlagPromoted = 1 << 0

// CQE is a completion entry: daemon → client.
//
//	0 user_data u64 | 8 value u64 | 16 offset u64 | 24 status u32 | 28 tier u8 | 29 flags u8 | 30 reserved u16
type CQE struct {
	UserData uint64
	Value    uint64 // token (reserve/acquire) or hit count (lookup)
	Offset   uint64 // arena offset of the slot (reserve/acquire)
	Status   Status
	Tier     Tier
	Flags    uint8
}

// Encode writes c into b (len ≥ CQESize).
func (c *CQE) Encode(b []byte) {
	_ = b[CQESize-1]
	binary.LittleEndian.PutUint64(b[0:], c.UserData)
	binary.LittleEndian.PutUint64(b[8:], c.Value)
	binary.LittleEndian.PutUint64(b[16:], c.Offset)
	binary.LittleEndian.PutUint32(b[24:], uint32(c.Status))
	b[28] = byte(c.Tier)
	b[29] = c.Flags
	binary.LittleEndian.PutUint16(b[30:], 0)
}

// Decode reads c from b (len ≥ CQESize).
func (c *CQE) Decode(b []byte) {
	_ = b[CQESize-1]
	c.UserData = binary.LittleEndian.Uint64(b[0:])
	c.Value = binary.LittleEndian.Uint64(b[8:])
	c.Offset = binary.LittleEndian.Uint64(b[16:])
	c.Status = Status(binary.LittleEndian.Uint32(b[24:]))
	c.Tier = Tier(b[28])
	c.Flags = b[29]
}

// EncodeHash writes h into b (len ≥ 16) as in a lookup buffer.
func EncodeHash(b []byte, h Hash) {
	binary.LittleEndian.PutUint64(b[0:], h.Hi)
	binary.LittleEndian.PutUint64(b[8:], h.Lo)
}

// DecodeHash reads a hash written by EncodeHash.
func DecodeHash(b []byte) Hash {
	return Hash{Hi: binary.LittleEndian.Uint64(b[0:]), Lo: binary.LittleEndian.Uint64(b[8:])}
}
