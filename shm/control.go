package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Control socket protocol (SOCK_SEQPACKET, one message per datagram):
//
//	header: magic u32 "KVTC" | version u16 | type u16 | payload length u32
//
// A session opens with Hello (client) → Welcome (daemon, with the arena and
// ring fds attached by SCM_RIGHTS) or Error. Afterwards the socket carries
// only out-of-band requests (Stats) and, by closing, the end of the session.
const (
	controlMagic = 0x4354_564b // "KVTC" little endian
	// ProtocolVersion is the version this build speaks; a daemon accepts
	// [MinProtocolVersion, ProtocolVersion].
	ProtocolVersion    = 1
	MinProtocolVersion = 1

	ctrlHdrLen = 12
	// MaxHelloSize bounds what the daemon reads before authentication.
	MaxHelloSize = 4096
	// MaxControlMsg bounds every other control message.
	MaxControlMsg = 1 << 20
)

// MsgType is a control message type.
type MsgType uint16

const (
	MsgHello      MsgType = 1
	MsgWelcome    MsgType = 2
	MsgError      MsgType = 3
	MsgStatsReq   MsgType = 4
	MsgStatsReply MsgType = 5
	MsgEvictReq   MsgType = 6
	MsgEvictReply MsgType = 7
	// MsgFlushReq (no payload) asks the daemon to write the host tier down
	// to NVMe; MsgFlushReply carries JSON {"blocks": n}.
	MsgFlushReq   MsgType = 8
	MsgFlushReply MsgType = 9
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed control message")

// EncodeHeader prefixes payload with a control header.
func EncodeMsg(t MsgType, version uint16, payload []byte) []byte {
	b := make([]byte, ctrlHdrLen+len(payload))
	binary.LittleEndian.PutUint32(b[0:], controlMagic)
	binary.LittleEndian.PutUint16(b[4:], version)
	binary.LittleEndian.PutUint16(b[6:], uint16(t))
	binary.LittleEndian.PutUint32(b[8:], uint32(len(payload)))
	copy(b[ctrlHdrLen:], payload)
	return b
}

// DecodeMsg splits a datagram into its header fields and payload.
func DecodeMsg(b []byte) (t MsgType, version uint16, payload []byte, err error) {
	if len(b) < ctrlHdrLen {
		return 0, 0, nil, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrMalformed, len(b), ctrlHdrLen)
	}
	if binary.LittleEndian.Uint32(b[0:]) != controlMagic {
		return 0, 0, nil, fmt.Errorf("%w: bad magic %#x", ErrMalformed, binary.LittleEndian.Uint32(b[0:]))
	}
	version = binary.LittleEndian.Uint16(b[4:])
	t = MsgType(binary.LittleEndian.Uint16(b[6:]))
	n := binary.LittleEndian.Uint32(b[8:])
	if uint64(n) != uint64(len(b)-ctrlHdrLen) {
		return 0, 0, nil, fmt.Errorf("%w: header says %d payload bytes, datagram has %d", ErrMalformed, n, len(b)-ctrlHdrLen)
	}
	return t, version, b[ctrlHdrLen:], nil
}

// Namespace is what makes blocks compatible: the model and its KV layout.
// Blocks of equal hash in different namespaces are different blocks.
type Namespace struct {
	ModelID        string `json:"model_id"`
	Layers         uint32 `json:"layers"`
	KVHeads        uint32 `json:"kv_heads"`
	HeadDim        uint32 `json:"head_dim"`
	DType          string `json:"dtype"`
	TokensPerBlock uint32 `json:"tokens_per_block"`
	TPRank         uint32 `json:"tp_rank"`
	TPSize         uint32 `json:"tp_size"`
	BlockBytes     uint64 `json:"block_bytes"`
}

// DTypes are the KV element types a namespace may declare.
var DTypes = []string{"fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4"}

// MaxBlockBytes bounds a namespace's block size.
const MaxBlockBytes = 1 << 30

// Validate checks a namespace as received from a peer; errors name the field.
func (n Namespace) Validate() error {
	switch {
	case len(n.ModelID) == 0 || len(n.ModelID) > 256:
		return fmt.Errorf("namespace model_id: length %d not in [1, 256]", len(n.ModelID))
	case !printable(n.ModelID):
		return fmt.Errorf("namespace model_id: must be printable UTF-8")
	case n.Layers == 0:
		return fmt.Errorf("namespace layers: must be > 0")
	case n.KVHeads == 0:
		return fmt.Errorf("namespace kv_heads: must be > 0")
	case n.HeadDim == 0:
		return fmt.Errorf("namespace head_dim: must be > 0")
	case n.TokensPerBlock == 0:
		return fmt.Errorf("namespace tokens_per_block: must be > 0")
	case n.TPSize == 0:
		return fmt.Errorf("namespace tp_size: must be > 0")
	case n.TPRank >= n.TPSize:
		return fmt.Errorf("namespace tp_rank: %d must be < tp_size %d", n.TPRank, n.TPSize)
	case n.BlockBytes == 0 || n.BlockBytes > MaxBlockBytes:
		return fmt.Errorf("namespace block_bytes: %d not in [1, %d]", n.BlockBytes, MaxBlockBytes)
	}
	for _, d := range DTypes {
		if n.DType == d {
			return nil
		}
	}
	return fmt.Errorf("namespace dtype: %q is not one of %v", n.DType, DTypes)
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// HelloFlagAdmin opens a control-only connection (status, evict): no
// namespace, no ring, no arena.
const HelloFlagAdmin = 1 << 0

// Hello is the client's first message.
type Hello struct {
	PID       uint32
	Flags     uint32
	GPUUUID   [16]byte
	Namespace Namespace
	Name      string // client name for logs, ≤ 255 bytes
}

// Encode returns the Hello payload.
func (h *Hello) Encode() []byte {
	var w writer
	w.u32(h.PID)
	w.u32(h.Flags)
	w.raw(h.GPUUUID[:])
	n := &h.Namespace
	w.u32(n.Layers)
	w.u32(n.KVHeads)
	w.u32(n.HeadDim)
	w.u32(n.TokensPerBlock)
	w.u32(n.TPRank)
	w.u32(n.TPSize)
	w.u64(n.BlockBytes)
	w.str8(n.DType)
	w.str16(n.ModelID)
	w.str8(h.Name)
	return w.b
}

// DecodeHello parses and validates a Hello payload.
func DecodeHello(p []byte) (Hello, error) {
	var h Hello
	r := reader{b: p}
	h.PID = r.u32()
	h.Flags = r.u32()
	copy(h.GPUUUID[:], r.raw(16))
	n := &h.Namespace
	n.Layers = r.u32()
	n.KVHeads = r.u32()
	n.HeadDim = r.u32()
	n.TokensPerBlock = r.u32()
	n.TPRank = r.u32()
	n.TPSize = r.u32()
	n.BlockBytes = r.u64()
	n.DType = r.str8()
	n.ModelID = r.str16()
	h.Name = r.str8()
	if err := r.done("hello"); err != nil {
		return Hello{}, err
	}
	if h.Flags&^HelloFlagAdmin != 0 {
		return Hello{}, fmt.Errorf("%w: hello: unknown flags %#x", ErrMalformed, h.Flags)
	}
	if !printable(h.Name) {
		return Hello{}, fmt.Errorf("%w: hello: client name must be printable UTF-8", ErrMalformed)
	}
	if h.Flags&HelloFlagAdmin == 0 {
		if err := h.Namespace.Validate(); err != nil {
			return Hello{}, fmt.Errorf("%w: hello: %v", ErrMalformed, err)
		}
	}
	return h, nil
}

// Welcome is the daemon's answer to a Hello. For a namespace session two
// fds travel with it: the host arena memfd, then the ring region memfd.
type Welcome struct {
	SessionID   uint64
	NamespaceID uint32
	Flags       uint32
	BlockBytes  uint64
	ArenaSize   uint64
	RingSize    uint64
	Ring        RingLayout
}

// WelcomeFDs is the number of fds attached to a namespace session's Welcome.
const WelcomeFDs = 2

// Encode returns the Welcome payload.
func (m *Welcome) Encode() []byte {
	var w writer
	w.u64(m.SessionID)
	w.u32(m.NamespaceID)
	w.u32(m.Flags)
	w.u64(m.BlockBytes)
	w.u64(m.ArenaSize)
	w.u64(m.RingSize)
	w.u32(m.Ring.Entries)
	w.u32(m.Ring.DataSize)
	return w.b
}

// DecodeWelcome parses a Welcome payload.
func DecodeWelcome(p []byte) (Welcome, error) {
	var m Welcome
	r := reader{b: p}
	m.SessionID = r.u64()
	m.NamespaceID = r.u32()
	m.Flags = r.u32()
	m.BlockBytes = r.u64()
	m.ArenaSize = r.u64()
	m.RingSize = r.u64()
	m.Ring.Entries = r.u32()
	m.Ring.DataSize = r.u32()
	if err := r.done("welcome"); err != nil {
		return Welcome{}, err
	}
	return m, nil
}

// Control error codes carried by MsgError.
type ErrCode uint32

const (
	CodeVersion      ErrCode = 1
	CodeUnauthorized ErrCode = 2
	CodeBadRequest   ErrCode = 3
	CodeNamespace    ErrCode = 4
	CodeBusy         ErrCode = 5
	CodeInternal     ErrCode = 6
	CodeShutdown     ErrCode = 7
)

// ErrorMsg is a MsgError payload: why the daemon refused.
type ErrorMsg struct {
	Code    ErrCode
	Message string
}

func (e *ErrorMsg) Encode() []byte {
	var w writer
	w.u32(uint32(e.Code))
	w.str16(cut(e.Message, 4000))
	return w.b
}

func DecodeError(p []byte) (ErrorMsg, error) {
	r := reader{b: p}
	e := ErrorMsg{Code: ErrCode(r.u32()), Message: r.str16()}
	if err := r.done("error"); err != nil {
		return ErrorMsg{}, err
	}
	return e, nil
}

// EvictReq asks the daemon to drop blocks: of one namespace, or all when
// All is set.
type EvictReq struct {
	NamespaceID uint32
	All         bool
}

func (e *EvictReq) Encode() []byte {
	var w writer
	w.u32(e.NamespaceID)
	if e.All {
		w.u32(1)
	} else {
		w.u32(0)
	}
	return w.b
}

func DecodeEvictReq(p []byte) (EvictReq, error) {
	r := reader{b: p}
	e := EvictReq{NamespaceID: r.u32()}
	all := r.u32()
	if err := r.done("evict"); err != nil {
		return EvictReq{}, err
	}
	if all > 1 {
		return EvictReq{}, fmt.Errorf("%w: evict: flag %d", ErrMalformed, all)
	}
	e.All = all == 1
	return e, nil
}

// writer and reader are the only little-endian codec helpers of the wire
// format. reader keeps a sticky error so decoders stay linear.
type writer struct{ b []byte }

func (w *writer) u32(v uint32)  { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *writer) u64(v uint64)  { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *writer) raw(p []byte)  { w.b = append(w.b, p...) }
func (w *writer) str8(s string) { s = cut(s, 255); w.b = append(append(w.b, byte(len(s))), s...) }
func (w *writer) str16(s string) {
	s = cut(s, 65535)
	w.b = append(binary.LittleEndian.AppendUint16(w.b, uint16(len(s))), s...)
}

// cut shortens s to at most n bytes without splitting a UTF-8 sequence, so
// a shortened name still passes the peer's printable check.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.err = fmt.Errorf("%w: truncated at byte %d (need %d more, have %d)", ErrMalformed, r.off, n, len(r.b)-r.off)
		return nil
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *reader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (r *reader) raw(n int) []byte { return r.take(n) }

func (r *reader) str8() string {
	p := r.take(1)
	if p == nil {
		return ""
	}
	return string(r.take(int(p[0])))
}

func (r *reader) str16() string {
	p := r.take(2)
	if p == nil {
		return ""
	}
	return string(r.take(int(binary.LittleEndian.Uint16(p))))
}

func (r *reader) done(what string) error {
	if r.err != nil {
		return fmt.Errorf("%s: %w", what, r.err)
	}
	if r.off != len(r.b) {
		return fmt.Errorf("%w: %s: %d trailing bytes", ErrMalformed, what, len(r.b)-r.off)
	}
	return nil
}
