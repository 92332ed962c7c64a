package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestSQEEncodeLayout(t *testing.T) {
	e := SQE{
		Op: OpLookup, Flags: 0xa5, Count: 0x11223344, UserData: 0x0102030405060708,
		Hash:  Hash{Hi: 0x1112131415161718, Lo: 0x2122232425262728},
		Token: 0x3132333435363738, Buf: 0x41424344, BufLen: 0x51525354,
	}
	b := bytes.Repeat([]byte{0xee}, SQESize)
	e.Encode(b)
	le := binary.LittleEndian
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"op@0", uint64(b[0]), uint64(OpLookup)},
		{"flags@1", uint64(b[1]), 0xa5},
		{"reserved@2", uint64(le.Uint16(b[2:])), 0},
		{"count@4", uint64(le.Uint32(b[4:])), 0x11223344},
		{"user_data@8", le.Uint64(b[8:]), 0x0102030405060708},
		{"hash hi@16", le.Uint64(b[16:]), 0x1112131415161718},
		{"hash lo@24", le.Uint64(b[24:]), 0x2122232425262728},
		{"token@32", le.Uint64(b[32:]), 0x3132333435363738},
		{"buf@40", uint64(le.Uint32(b[40:])), 0x41424344},
		{"buf_len@44", uint64(le.Uint32(b[44:])), 0x51525354},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
	if !bytes.Equal(b[48:], make([]byte, 16)) {
		t.Errorf("reserved 48..63 not zeroed: % x", b[48:])
	}
	var d SQE
	d.Decode(b)
	if d != e {
		t.Fatalf("decode = %+v, want %+v", d, e)
	}
	// Decoding ignores the reserved bytes.
	b[2], b[3], b[63] = 1, 2, 3
	d = SQE{}
	d.Decode(b)
	if d != e {
		t.Fatalf("decode with reserved bytes set = %+v, want %+v", d, e)
	}
}

func TestCQEEncodeLayout(t *testing.T) {
	c := CQE{
		UserData: 0x0102030405060708, Value: 0x1112131415161718, Offset: 0x2122232425262728,
		Status: Status(0x31323334), Tier: TierNVMe, Flags: 0x5a,
	}
	b := bytes.Repeat([]byte{0xee}, CQESize)
	c.Encode(b)
	le := binary.LittleEndian
	if le.Uint64(b[0:]) != c.UserData || le.Uint64(b[8:]) != c.Value || le.Uint64(b[16:]) != c.Offset ||
		le.Uint32(b[24:]) != 0x31323334 || b[28] != byte(TierNVMe) || b[29] != 0x5a || le.Uint16(b[30:]) != 0 {
		t.Fatalf("CQE layout wrong: % x", b)
	}
	var d CQE
	d.Decode(b)
	if d != c {
		t.Fatalf("decode = %+v, want %+v", d, c)
	}
}

func TestHashEncode(t *testing.T) {
	h := Hash{Hi: 0xdeadbeefcafef00d, Lo: 42}
	b := make([]byte, 16)
	EncodeHash(b, h)
	if DecodeHash(b) != h {
		t.Fatal("hash round trip")
	}
	if h.String() != "deadbeefcafef00d000000000000002a" {
		t.Fatalf("String = %s", h)
	}
}

func TestOpStatusTierStrings(t *testing.T) {
	for o := Op(0); o < 12; o++ {
		if o.String() == "" {
			t.Fatalf("op %d has empty name", o)
		}
		if o.Valid() != (o >= OpLookup && o <= OpNop) {
			t.Fatalf("op %d Valid = %v", o, o.Valid())
		}
	}
	if Op(200).String() != "op(200)" || Status(99).String() != "status(99)" || Tier(9).String() != "tier(9)" {
		t.Fatal("fallback names")
	}
	if StatusClosing.String() != "daemon closing" || TierHost.String() != "host" {
		t.Fatal("names")
	}
}

func TestLookupSpan(t *testing.T) {
	const per = LookupKeySize + 1
	tests := []struct {
		name    string
		e       SQE
		dataLen int
		keys    [2]int
		results [2]int
		wantErr string
	}{
		{name: "count 0", e: SQE{Count: 0, Buf: 0, BufLen: 100}, dataLen: 100, wantErr: "zero keys"},
		{name: "exact fit", e: SQE{Count: 4, Buf: 0, BufLen: 4 * per}, dataLen: 4 * per,
			keys: [2]int{0, 64}, results: [2]int{64, 68}},
		{name: "exact fit at end", e: SQE{Count: 2, Buf: 100, BufLen: 2 * per}, dataLen: 100 + 2*per,
			keys: [2]int{100, 132}, results: [2]int{132, 134}},
		{name: "buffer larger than needed", e: SQE{Count: 1, Buf: 8, BufLen: 64}, dataLen: 4096,
			keys: [2]int{8, 24}, results: [2]int{24, 25}},
		{name: "buffer one byte short", e: SQE{Count: 4, Buf: 0, BufLen: 4*per - 1}, dataLen: 4096, wantErr: "outside data area"},
		{name: "one byte over data area", e: SQE{Count: 4, Buf: 1, BufLen: 4 * per}, dataLen: 4 * per, wantErr: "outside data area"},
		{name: "buf past data area", e: SQE{Count: 1, Buf: 4096, BufLen: per}, dataLen: 4096, wantErr: "outside data area"},
		{name: "buf+buflen overflows uint32", e: SQE{Count: 1, Buf: math.MaxUint32 - 5, BufLen: 100}, dataLen: 4096, wantErr: "outside data area"},
		{name: "buf+buflen overflows uint32 huge data", e: SQE{Count: 1, Buf: math.MaxUint32, BufLen: math.MaxUint32}, dataLen: math.MaxUint32, wantErr: "outside data area"},
		{name: "huge count", e: SQE{Count: math.MaxUint32, Buf: 0, BufLen: math.MaxUint32}, dataLen: math.MaxUint32, wantErr: "outside data area"},
		{name: "count*17 wraps uint32", e: SQE{Count: 0x0f0f0f10, Buf: 0, BufLen: 16}, dataLen: 4096, wantErr: "outside data area"},
		{name: "zero data area", e: SQE{Count: 1, Buf: 0, BufLen: per}, dataLen: 0, wantErr: "outside data area"},
		{name: "negative data area", e: SQE{Count: 1, Buf: 0, BufLen: per}, dataLen: -1, wantErr: "outside data area"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			keys, results, err := tc.e.LookupSpan(tc.dataLen)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q (keys %v results %v)", err, tc.wantErr, keys, results)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if keys != tc.keys || results != tc.results {
				t.Fatalf("spans keys %v results %v, want %v %v", keys, results, tc.keys, tc.results)
			}
		})
	}
}

func TestRingLayout(t *testing.T) {
	tests := []struct {
		l       RingLayout
		ok      bool
		dataOff int
		size    int64
	}{
		{RingLayout{Entries: 8, DataSize: 0}, true, 4096, 4096},
		{RingLayout{Entries: 8, DataSize: 1}, true, 4096, 8192},
		{RingLayout{Entries: 64, DataSize: 4096}, true, 8192, 12288},                      // 512+64*96 = 6656
		{RingLayout{Entries: 1 << 16, DataSize: 1 << 30}, true, 6295552, 6295552 + 1<<30}, // 512+65536*96 = 6291968, page aligned
		{RingLayout{Entries: 0}, false, 0, 0},
		{RingLayout{Entries: 4}, false, 0, 0},
		{RingLayout{Entries: 12}, false, 0, 0},
		{RingLayout{Entries: 1 << 17}, false, 0, 0},
		{RingLayout{Entries: 1 << 31}, false, 0, 0},
		{RingLayout{Entries: 8, DataSize: 1<<30 + 1}, false, 0, 0},
		{RingLayout{Entries: 8, DataSize: math.MaxUint32}, false, 0, 0},
	}
	for _, tc := range tests {
		err := tc.l.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%+v: Validate = %v, want ok=%v", tc.l, err, tc.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrRingCorrupt) {
				t.Errorf("%+v: error %v does not wrap ErrRingCorrupt", tc.l, err)
			}
			continue
		}
		if tc.l.DataOff() != tc.dataOff || tc.l.Size() != tc.size {
			t.Errorf("%+v: DataOff %d Size %d, want %d %d", tc.l, tc.l.DataOff(), tc.l.Size(), tc.dataOff, tc.size)
		}
		if tc.l.Size()%4096 != 0 || tc.l.DataOff()%4096 != 0 {
			t.Errorf("%+v: not page aligned", tc.l)
		}
		if tc.l.cqOff() != ringHdrLen+int(tc.l.Entries)*SQESize ||
			tc.l.DataOff() < tc.l.cqOff()+int(tc.l.Entries)*CQESize {
			t.Errorf("%+v: areas overlap", tc.l)
		}
	}
}
