//go:build !cuda

package cudaipc

import "testing"

// FuzzDecodeEmuHandle: a client decodes the handle it read from the
// daemon's socket. An accepted handle has every field in range and is
// exactly what encodeEmuHandle writes for them (no bytes ignored).
func FuzzDecodeEmuHandle(f *testing.F) {
	valid := encodeEmuHandle(emuHandle{pid: 1234, fd: 7, ordinal: 1, size: 64 << 20,
		nonce: [16]byte{1, 2, 3}, uuid: emulatedUUID(1)})
	f.Add(valid[:])
	trailing := valid
	trailing[len(trailing)-1] = 1
	f.Add(trailing[:])
	huge := encodeEmuHandle(emuHandle{pid: 1 << 30, fd: 7, ordinal: 1, size: 1 << 50})
	f.Add(huge[:])
	f.Add([]byte("KVEMGPU1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h IPCHandle
		copy(h[:], b)
		e, err := decodeEmuHandle(h)
		if err != nil {
			return
		}
		if e.pid <= 0 || e.pid > 1<<22 || e.fd < 0 || e.fd > 1<<20 || e.ordinal < 0 || e.ordinal > 64 || e.size <= 0 || e.size > 1<<46 {
			t.Fatalf("accepted out-of-range fields %+v", e)
		}
		if again := encodeEmuHandle(e); again != h {
			t.Fatalf("decoded %x as %+v, which encodes to %x", h, e, again)
		}
	})
}
