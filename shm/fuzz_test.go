package shm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"testing"
)

// Every decoder of peer input has a fuzz target. The seeds cover valid
// encodings, truncations and oversized length fields; the stored corpus in
// testdata/fuzz is replayed by plain `go test`.

func FuzzDecodeMsg(f *testing.F) {
	ok := EncodeMsg(MsgHello, ProtocolVersion, []byte("payload"))
	f.Add(ok)
	f.Add(ok[:ctrlHdrLen])
	f.Add(ok[:ctrlHdrLen-1])
	f.Add(EncodeMsg(MsgStatsReq, 0xffff, nil))
	big := bytes.Clone(ok)
	binary.LittleEndian.PutUint32(big[8:], 0xffffffff)
	f.Add(big)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		mt, v, p, err := DecodeMsg(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if len(p) != len(b)-ctrlHdrLen {
			t.Fatalf("payload %d bytes of a %d-byte datagram", len(p), len(b))
		}
		if re := EncodeMsg(mt, v, p); !bytes.Equal(re, b) {
			t.Fatalf("re-encoding differs:\n% x\n% x", re, b)
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	h := validHello()
	valid := h.Encode()
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(valid[:40])
	f.Add(append(bytes.Clone(valid), 0))
	admin := Hello{Flags: HelloFlagAdmin, Name: "ctl"}
	f.Add(admin.Encode())
	// Oversized string lengths: model_id claims 65535 bytes, name 255.
	over := bytes.Clone(valid)
	mOff := 4 + 4 + 16 + 6*4 + 8 + 1 + len(h.Namespace.DType)
	binary.LittleEndian.PutUint16(over[mOff:], 0xffff)
	f.Add(over)
	over2 := bytes.Clone(valid)
	over2[len(over2)-len(h.Name)-1] = 0xff
	f.Add(over2)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		h, err := DecodeHello(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			if h != (Hello{}) {
				t.Fatalf("failed decode returned %+v", h)
			}
			return
		}
		re := h.Encode()
		if !bytes.Equal(re, p) {
			t.Fatalf("decoded hello re-encodes differently:\n% x\n% x", re, p)
		}
		h2, err := DecodeHello(re)
		if err != nil || h2 != h {
			t.Fatalf("second decode: %+v, %v", h2, err)
		}
		if h.Flags&HelloFlagAdmin == 0 {
			if err := h.Namespace.Validate(); err != nil {
				t.Fatalf("accepted invalid namespace: %v", err)
			}
		}
	})
}

func FuzzDecodeWelcome(f *testing.F) {
	w := Welcome{SessionID: 1, NamespaceID: 2, Flags: 3, BlockBytes: 4, ArenaSize: 5, RingSize: 6, Ring: RingLayout{Entries: 64, DataSize: 4096}}
	valid := w.Encode()
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(append(bytes.Clone(valid), 0))
	f.Add(bytes.Repeat([]byte{0xff}, len(valid)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := DecodeWelcome(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if re := m.Encode(); !bytes.Equal(re, p) {
			t.Fatalf("re-encoding differs")
		}
		// Whatever geometry a peer announces, validating it must not panic
		// and a valid one must have a sane size.
		if m.Ring.Validate() == nil {
			if s := m.Ring.Size(); s <= 0 || s%4096 != 0 || s < int64(m.Ring.DataSize) {
				t.Fatalf("valid layout %+v has size %d", m.Ring, s)
			}
		}
	})
}

func FuzzDecodeError(f *testing.F) {
	e := ErrorMsg{Code: CodeNamespace, Message: "namespace tp_rank: 3 must be < tp_size 2"}
	valid := e.Encode()
	f.Add(valid)
	f.Add(valid[:5])
	f.Add(valid[:3])
	f.Add(append(bytes.Clone(valid), 'x'))
	over := bytes.Clone(valid)
	binary.LittleEndian.PutUint16(over[4:], 0xffff)
	f.Add(over)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := DecodeError(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if len(m.Message) > 4000 {
			return // Encode truncates; no identity expected
		}
		if re := m.Encode(); !bytes.Equal(re, p) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func FuzzDecodeEvictReq(f *testing.F) {
	for _, e := range []EvictReq{{NamespaceID: 9}, {All: true}} {
		f.Add(e.Encode())
	}
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := DecodeEvictReq(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			if m != (EvictReq{}) {
				t.Fatalf("failed decode returned %+v", m)
			}
			return
		}
		if re := m.Encode(); !bytes.Equal(re, p) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzDecodeStats: a stats reply that decodes lists no more namespaces
// than it counts, and decodes to the same report once re-encoded.
func FuzzDecodeStats(f *testing.F) {
	valid, err := json.Marshal(Stats{Version: "v", Tiers: []TierStats{{Name: "host"}}, Ops: map[string]uint64{"get": 1},
		Namespaces: []NamespaceStats{{ID: 1, Namespace: Namespace{ModelID: "m"}}, {ID: 2}}, NamespacesTotal: 5})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add([]byte(`{"namespaces":[{"id":1}]}`))
	f.Add([]byte(`{"namespaces":[{"id":1},{"id":2}],"namespaces_total":1}`))
	f.Add([]byte(`{"namespaces_total":-1}`))
	f.Add([]byte(`{"namespaces_total":4294967296}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, p []byte) {
		st, err := DecodeStats(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if st.NamespacesTotal < len(st.Namespaces) {
			t.Fatalf("%d namespaces listed, %d counted", len(st.Namespaces), st.NamespacesTotal)
		}
		b, err := json.Marshal(st)
		if err != nil {
			return // e.g. a NaN float cannot be re-encoded; it was decoded from JSON, so unlikely
		}
		again, err := DecodeStats(b)
		if err != nil && len(b) <= MaxControlMsg {
			t.Fatalf("a decoded report re-encoded does not decode: %v", err)
		}
		if err == nil && (again.NamespacesTotal != st.NamespacesTotal || len(again.Namespaces) != len(st.Namespaces)) {
			t.Fatalf("re-encoded: %d of %d namespaces, was %d of %d", len(again.Namespaces), again.NamespacesTotal, len(st.Namespaces), st.NamespacesTotal)
		}
	})
}

func FuzzSQEDecode(f *testing.F) {
	seed := func(e SQE, dataLen int) {
		b := make([]byte, SQESize)
		e.Encode(b)
		f.Add(b, dataLen)
	}
	seed(SQE{Op: OpLookup, Count: 4, Buf: 0, BufLen: 4 * (LookupKeySize + 1)}, 4*(LookupKeySize+1))
	seed(SQE{Op: OpLookup, Count: 4, Buf: 1, BufLen: 4 * (LookupKeySize + 1)}, 4*(LookupKeySize+1))
	seed(SQE{Op: OpLookup, Count: 1, Buf: 0xfffffff0, BufLen: 0x20}, 1<<30)
	seed(SQE{Op: OpLookup, Count: 0xffffffff, Buf: 0, BufLen: 0xffffffff}, 1<<30)
	seed(SQE{Op: OpReserve, UserData: 7, Hash: Hash{1, 2}, Token: 3}, 0)
	seed(SQE{Op: OpLookup, Count: 1, BufLen: 17}, -1)
	f.Add(bytes.Repeat([]byte{0xff}, SQESize), 4096)
	f.Fuzz(func(t *testing.T, raw []byte, dataLen int) {
		b := make([]byte, SQESize)
		copy(b, raw)
		var e SQE
		e.Decode(b)
		re := make([]byte, SQESize)
		e.Encode(re)
		// Encode zeroes the reserved bytes; everything else round-trips.
		want := bytes.Clone(b)
		clear(want[2:4])
		clear(want[48:])
		if !bytes.Equal(re, want) {
			t.Fatalf("SQE round trip:\n% x\n% x", re, want)
		}
		var e2 SQE
		e2.Decode(re)
		if e2 != e {
			t.Fatalf("decode(encode(e)) = %+v, want %+v", e2, e)
		}

		keys, results, err := e.LookupSpan(dataLen)
		per := uint64(LookupKeySize + 1)
		fits := e.Count > 0 && dataLen >= 0 && uint64(e.Count)*per <= uint64(e.BufLen) &&
			uint64(e.Buf)+uint64(e.BufLen) <= uint64(dataLen)
		if (err == nil) != fits {
			t.Fatalf("LookupSpan(%+v, %d) err = %v, want fits=%v", e, dataLen, err, fits)
		}
		if err != nil {
			return
		}
		if keys[0] != int(e.Buf) || keys[1]-keys[0] != int(e.Count)*LookupKeySize ||
			results[0] != keys[1] || results[1]-results[0] != int(e.Count) {
			t.Fatalf("spans keys %v results %v inconsistent with %+v", keys, results, e)
		}
		if keys[0] < 0 || results[1] > dataLen || uint64(results[1]) > uint64(e.Buf)+uint64(e.BufLen) {
			t.Fatalf("spans keys %v results %v outside data area %d / buffer %+v", keys, results, dataLen, e)
		}
	})
}

func FuzzCQEDecode(f *testing.F) {
	b := make([]byte, CQESize)
	c := CQE{UserData: 1, Value: 2, Offset: 3, Status: StatusFull, Tier: TierHost, Flags: 1}
	c.Encode(b)
	f.Add(b)
	f.Add(bytes.Repeat([]byte{0xff}, CQESize))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, raw []byte) {
		b := make([]byte, CQESize)
		copy(b, raw)
		var c CQE
		c.Decode(b)
		_ = c.Status.String()
		_ = c.Tier.String()
		re := make([]byte, CQESize)
		c.Encode(re)
		want := bytes.Clone(b)
		clear(want[30:])
		if !bytes.Equal(re, want) {
			t.Fatalf("CQE round trip:\n% x\n% x", re, want)
		}
	})
}

// FuzzRingDaemonPop lets the fuzzer play a hostile client: it writes the
// shared header (indices, sleep flags, futex words) and the entries, and
// chooses where the daemon's private indices stand. The daemon side must
// return entries or ErrRingCorrupt and never more than the ring holds.
func FuzzRingDaemonPop(f *testing.F) {
	hdr := func(sqTail, cqHead uint32) []byte {
		h := make([]byte, ringHdrLen)
		binary.LittleEndian.PutUint32(h[offSQTail:], sqTail)
		binary.LittleEndian.PutUint32(h[offCQHead:], cqHead)
		return h
	}
	sqes := make([]byte, 8*SQESize)
	for i := 0; i < 8; i++ {
		e := SQE{Op: OpNop, UserData: uint64(i)}
		e.Encode(sqes[i*SQESize:])
	}
	f.Add(uint8(0), uint32(0), uint32(0), uint8(8), hdr(3, 0), sqes)
	f.Add(uint8(0), uint32(0), uint32(0), uint8(8), hdr(8, 0), sqes)
	f.Add(uint8(0), uint32(0), uint32(0), uint8(8), hdr(9, 0), sqes)                            // tail past head+entries
	f.Add(uint8(0), uint32(5), uint32(0), uint8(8), hdr(4, 0), sqes)                            // tail behind head
	f.Add(uint8(0), uint32(0), uint32(0), uint8(8), hdr(0, 1), sqes)                            // cq head past tail
	f.Add(uint8(1), uint32(0xfffffffc), uint32(0xfffffffe), uint8(3), hdr(4, 0xfffffff8), sqes) // wrap
	f.Add(uint8(2), uint32(7), uint32(7), uint8(255), bytes.Repeat([]byte{0xff}, ringHdrLen), []byte{})
	f.Fuzz(func(t *testing.T, entriesLog uint8, sqHead, cqTail uint32, batch uint8, header, entries []byte) {
		l := RingLayout{Entries: MinRingEntries << (entriesLog % 4), DataSize: 64}
		mem := make([]byte, l.Size())
		d, err := NewRing(mem, l, true)
		if err != nil {
			t.Fatal(err)
		}
		// The daemon's private indices may stand anywhere (long sessions
		// wrap), with the shared copies it published consistent.
		d.localSQ, d.localCQ = sqHead, cqTail
		d.sqHead.Store(sqHead)
		d.cqTail.Store(cqTail)
		// The hostile client overwrites everything it can write (the
		// whole header after the geometry; the daemon never re-reads that).
		if len(header) > 16 {
			copy(mem[16:ringHdrLen], header[16:])
		}
		copy(mem[l.sqOff():l.cqOff()], entries)

		dst := make([]SQE, int(batch)%(int(l.Entries)+3))
		tail := d.sqTail.Load()
		n, err := d.DaemonPop(dst)
		if err != nil {
			if !errors.Is(err, ErrRingCorrupt) || n != 0 {
				t.Fatalf("DaemonPop = %d, %v", n, err)
			}
			if tail-sqHead <= l.Entries {
				t.Fatalf("DaemonPop rejected a consistent tail %d (head %d): %v", tail, sqHead, err)
			}
			if d.localSQ != sqHead {
				t.Fatal("DaemonPop moved its head on error")
			}
		} else {
			if n < 0 || n > int(l.Entries) || n > len(dst) || n != min(int(tail-sqHead), len(dst)) {
				t.Fatalf("DaemonPop = %d (tail %d head %d, batch %d, entries %d)", n, tail, sqHead, len(dst), l.Entries)
			}
			if d.localSQ != sqHead+uint32(n) || d.sqHead.Load() != d.localSQ {
				t.Fatal("DaemonPop did not publish its head")
			}
			for i := 0; i < n; i++ {
				var want SQE
				want.Decode(d.sqe(sqHead + uint32(i)))
				if dst[i] != want {
					t.Fatalf("entry %d = %+v, want %+v", i, dst[i], want)
				}
			}
		}

		head := d.cqHead.Load()
		space, err := d.DaemonCQSpace()
		if err != nil {
			if !errors.Is(err, ErrRingCorrupt) || space != 0 {
				t.Fatalf("DaemonCQSpace = %d, %v", space, err)
			}
			if cqTail-head <= l.Entries {
				t.Fatalf("DaemonCQSpace rejected a consistent head %d (tail %d): %v", head, cqTail, err)
			}
			return
		}
		if space < 0 || space > int(l.Entries) || space != int(l.Entries-(cqTail-head)) {
			t.Fatalf("DaemonCQSpace = %d (head %d tail %d entries %d)", space, head, cqTail, l.Entries)
		}
		d.DaemonPush(make([]CQE, space))
		if d.localCQ != cqTail+uint32(space) {
			t.Fatal("DaemonPush did not advance the tail")
		}

		// The client view over the same hostile header must not overrun
		// either.
		c, err := NewRing(mem, l, false)
		if err != nil {
			t.Fatalf("client view: %v", err)
		}
		c.localSQ = d.sqTail.Load()
		c.localCQ = d.cqHead.Load()
		if pushed := c.ClientPush(make([]SQE, l.Entries+1)); pushed < 0 || pushed > int(l.Entries) {
			t.Fatalf("ClientPush = %d", pushed)
		}
		if popped := c.ClientPop(make([]CQE, l.Entries+1)); popped < 0 || popped > int(l.Entries) {
			t.Fatalf("ClientPop = %d", popped)
		}
	})
}
