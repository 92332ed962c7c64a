package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

func validNamespace() Namespace {
	return Namespace{
		ModelID:        "meta-llama/Llama-3.1-8B",
		Layers:         32,
		KVHeads:        8,
		HeadDim:        128,
		DType:          "bf16",
		TokensPerBlock: 16,
		TPRank:         1,
		TPSize:         2,
		BlockBytes:     2 * 32 * 8 * 128 * 16 * 2,
	}
}

func validHello() Hello {
	return Hello{
		PID:       4242,
		Flags:     0,
		GPUUUID:   [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		Namespace: validNamespace(),
		Name:      "vllm-worker-1",
	}
}

func TestDecodeMsg(t *testing.T) {
	ok := EncodeMsg(MsgStatsReq, ProtocolVersion, []byte("abc"))
	badMagic := bytes.Clone(ok)
	badMagic[0] ^= 0xff
	longLen := bytes.Clone(ok)
	binary.LittleEndian.PutUint32(longLen[8:], 4)
	shortLen := bytes.Clone(ok)
	binary.LittleEndian.PutUint32(shortLen[8:], 2)
	hugeLen := bytes.Clone(ok)
	binary.LittleEndian.PutUint32(hugeLen[8:], 0xffffffff)

	tests := []struct {
		name    string
		in      []byte
		wantErr string
		t       MsgType
		version uint16
		payload []byte
	}{
		{name: "nil", in: nil, wantErr: "shorter than"},
		{name: "short", in: ok[:ctrlHdrLen-1], wantErr: "shorter than"},
		{name: "bad magic", in: badMagic, wantErr: "bad magic"},
		{name: "length too long", in: longLen, wantErr: "header says 4 payload bytes, datagram has 3"},
		{name: "length too short", in: shortLen, wantErr: "header says 2 payload bytes"},
		{name: "length huge", in: hugeLen, wantErr: "header says 4294967295"},
		{name: "trailing byte", in: append(bytes.Clone(ok), 0), wantErr: "datagram has 4"},
		{name: "ok", in: ok, t: MsgStatsReq, version: ProtocolVersion, payload: []byte("abc")},
		{name: "ok empty", in: EncodeMsg(MsgEvictReply, 7, nil), t: MsgEvictReply, version: 7, payload: []byte{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mt, v, p, err := DecodeMsg(tc.in)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want ErrMalformed containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if mt != tc.t || v != tc.version || !bytes.Equal(p, tc.payload) {
				t.Fatalf("got (%d, %d, %q), want (%d, %d, %q)", mt, v, p, tc.t, tc.version, tc.payload)
			}
		})
	}
}

func TestEncodeMsgLayout(t *testing.T) {
	b := EncodeMsg(MsgWelcome, 0x0102, []byte{9, 8})
	want := []byte{'K', 'V', 'T', 'C', 0x02, 0x01, 0x02, 0x00, 2, 0, 0, 0, 9, 8}
	if !bytes.Equal(b, want) {
		t.Fatalf("EncodeMsg = % x, want % x", b, want)
	}
}

func TestHelloRoundTrip(t *testing.T) {
	for _, h := range []Hello{
		validHello(),
		{Flags: HelloFlagAdmin, Name: "kvtierctl"}, // admin: no namespace
		{Flags: HelloFlagAdmin},
		func() Hello {
			h := validHello()
			h.Namespace.ModelID = strings.Repeat("m", 256)
			h.Name = strings.Repeat("n", 255)
			h.Namespace.BlockBytes = MaxBlockBytes
			h.Namespace.DType = "int4"
			return h
		}(),
		func() Hello {
			h := validHello()
			h.Name = "ünïcödé ✓"
			h.Namespace.TPRank, h.Namespace.TPSize = 0, 1
			return h
		}(),
	} {
		p := h.Encode()
		got, err := DecodeHello(p)
		if err != nil {
			t.Fatalf("DecodeHello(%+v): %v", h, err)
		}
		if got != h {
			t.Fatalf("round trip: got %+v, want %+v", got, h)
		}
		if !bytes.Equal(got.Encode(), p) {
			t.Fatal("re-encoding differs")
		}
	}
}

func TestDecodeHelloTruncated(t *testing.T) {
	h := validHello()
	p := h.Encode()
	for i := 0; i < len(p); i++ {
		_, err := DecodeHello(p[:i])
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "truncated") {
			t.Fatalf("prefix of %d/%d bytes: err = %v, want truncated", i, len(p), err)
		}
	}
}

func TestDecodeHelloErrors(t *testing.T) {
	enc := func(mod func(*Hello)) []byte {
		h := validHello()
		mod(&h)
		return h.Encode()
	}
	ns := func(mod func(*Namespace)) []byte {
		return enc(func(h *Hello) { mod(&h.Namespace) })
	}
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"trailing bytes", append(enc(func(*Hello) {}), 0), "1 trailing bytes"},
		{"unknown flags", enc(func(h *Hello) { h.Flags = 1 << 5 }), "unknown flags 0x20"},
		{"unknown flags with admin", enc(func(h *Hello) { h.Flags = HelloFlagAdmin | 2 }), "unknown flags"},
		{"name control char", enc(func(h *Hello) { h.Name = "bad\nname" }), "client name must be printable"},
		{"name DEL", enc(func(h *Hello) { h.Name = "x\x7f" }), "client name must be printable"},
		{"name invalid utf8", enc(func(h *Hello) { h.Name = "\xff\xfe" }), "client name must be printable"},
		{"admin name invalid", enc(func(h *Hello) { h.Flags = HelloFlagAdmin; h.Name = "\x00" }), "client name must be printable"},
		{"model_id empty", ns(func(n *Namespace) { n.ModelID = "" }), "namespace model_id: length 0"},
		{"model_id too long", ns(func(n *Namespace) { n.ModelID = strings.Repeat("a", 257) }), "namespace model_id: length 257"},
		{"model_id not printable", ns(func(n *Namespace) { n.ModelID = "a\tb" }), "namespace model_id: must be printable"},
		{"model_id invalid utf8", ns(func(n *Namespace) { n.ModelID = "a\xc3" }), "namespace model_id: must be printable"},
		{"layers zero", ns(func(n *Namespace) { n.Layers = 0 }), "namespace layers"},
		{"kv_heads zero", ns(func(n *Namespace) { n.KVHeads = 0 }), "namespace kv_heads"},
		{"head_dim zero", ns(func(n *Namespace) { n.HeadDim = 0 }), "namespace head_dim"},
		{"tokens_per_block zero", ns(func(n *Namespace) { n.TokensPerBlock = 0 }), "namespace tokens_per_block"},
		{"tp_size zero", ns(func(n *Namespace) { n.TPSize = 0; n.TPRank = 0 }), "namespace tp_size"},
		{"tp_rank equal", ns(func(n *Namespace) { n.TPRank = 2; n.TPSize = 2 }), "namespace tp_rank: 2 must be < tp_size 2"},
		{"tp_rank above", ns(func(n *Namespace) { n.TPRank = 9; n.TPSize = 2 }), "namespace tp_rank"},
		{"block_bytes zero", ns(func(n *Namespace) { n.BlockBytes = 0 }), "namespace block_bytes: 0"},
		{"block_bytes too big", ns(func(n *Namespace) { n.BlockBytes = MaxBlockBytes + 1 }), "namespace block_bytes: 1073741825"},
		{"block_bytes huge", ns(func(n *Namespace) { n.BlockBytes = 1 << 63 }), "namespace block_bytes"},
		{"dtype unknown", ns(func(n *Namespace) { n.DType = "fp64" }), `namespace dtype: "fp64"`},
		{"dtype empty", ns(func(n *Namespace) { n.DType = "" }), `namespace dtype: ""`},
		{"dtype case", ns(func(n *Namespace) { n.DType = "BF16" }), "namespace dtype"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := DecodeHello(tc.in)
			if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrMalformed containing %q", err, tc.want)
			}
			if h != (Hello{}) {
				t.Fatalf("failed decode returned non-zero Hello %+v", h)
			}
		})
	}
}

func TestNamespaceValidate(t *testing.T) {
	if err := validNamespace().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, d := range DTypes {
		n := validNamespace()
		n.DType = d
		if err := n.Validate(); err != nil {
			t.Errorf("dtype %s: %v", d, err)
		}
	}
	// Admin hellos skip namespace validation entirely.
	h := Hello{Flags: HelloFlagAdmin, Namespace: Namespace{TPRank: 5, DType: "nope"}}
	if _, err := DecodeHello(h.Encode()); err != nil {
		t.Fatalf("admin hello with empty namespace: %v", err)
	}
}

func TestHelloEncodeTruncatesName(t *testing.T) {
	h := validHello()
	h.Name = strings.Repeat("x", 300)
	got, err := DecodeHello(h.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Name) != 255 {
		t.Fatalf("name length %d, want 255", len(got.Name))
	}
}

func TestWelcomeRoundTrip(t *testing.T) {
	w := Welcome{
		SessionID: 0x0102030405060708, NamespaceID: 7, Flags: 3,
		BlockBytes: 1 << 20, ArenaSize: 1 << 34, RingSize: 1 << 16,
		Ring: RingLayout{Entries: 256, DataSize: 1 << 16},
	}
	p := w.Encode()
	if len(p) != 48 {
		t.Fatalf("welcome is %d bytes, want 48", len(p))
	}
	got, err := DecodeWelcome(p)
	if err != nil || got != w {
		t.Fatalf("DecodeWelcome = %+v, %v; want %+v", got, err, w)
	}
	for i := 0; i < len(p); i++ {
		if _, err := DecodeWelcome(p[:i]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("prefix %d: err = %v", i, err)
		}
	}
	if _, err := DecodeWelcome(append(p, 1)); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "trailing") {
		t.Fatalf("trailing: err = %v", err)
	}
}

func TestErrorRoundTrip(t *testing.T) {
	for _, e := range []ErrorMsg{
		{Code: CodeVersion, Message: "protocol version 9 not in [1, 1]"},
		{Code: CodeShutdown},
		{Code: ErrCode(0xdeadbeef), Message: "ünïcödé"},
	} {
		p := e.Encode()
		got, err := DecodeError(p)
		if err != nil || got != e {
			t.Fatalf("DecodeError = %+v, %v; want %+v", got, err, e)
		}
		for i := 0; i < len(p); i++ {
			if _, err := DecodeError(p[:i]); !errors.Is(err, ErrMalformed) {
				t.Fatalf("prefix %d: err = %v", i, err)
			}
		}
		if _, err := DecodeError(append(p, 0)); !errors.Is(err, ErrMalformed) {
			t.Fatalf("trailing: err = %v", err)
		}
	}
	long := ErrorMsg{Code: CodeInternal, Message: strings.Repeat("e", 5000)}
	got, err := DecodeError(long.Encode())
	if err != nil || len(got.Message) != 4000 {
		t.Fatalf("long message: %d bytes, %v; want 4000", len(got.Message), err)
	}
}

func TestEvictReqRoundTrip(t *testing.T) {
	for _, e := range []EvictReq{{NamespaceID: 3}, {NamespaceID: 0xffffffff, All: true}, {}} {
		p := e.Encode()
		got, err := DecodeEvictReq(p)
		if err != nil || got != e {
			t.Fatalf("DecodeEvictReq = %+v, %v; want %+v", got, err, e)
		}
	}
	bad := (&EvictReq{NamespaceID: 1}).Encode()
	binary.LittleEndian.PutUint32(bad[4:], 2)
	if _, err := DecodeEvictReq(bad); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "flag 2") {
		t.Fatalf("flag 2: err = %v", err)
	}
	if _, err := DecodeEvictReq(bad[:7]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short: err = %v", err)
	}
	if _, err := DecodeEvictReq(append((&EvictReq{}).Encode(), 0)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing: err = %v", err)
	}
}
