package shm

import (
	"bytes"
	"errors"
	"testing"
)

func TestGPUArenaRoundTrip(t *testing.T) {
	g := GPUArena{Size: 64 << 20, SlabBytes: 8 << 20}
	g.UUID[3], g.Handle[0], g.Handle[63] = 7, 1, 2
	got, err := DecodeGPUArena(g.Encode())
	if err != nil || got != g {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	bad := g.Encode()
	bad[0] = 2 // version
	if _, err := DecodeGPUArena(bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("version 2 accepted: %v", err)
	}
	for n := 0; n < len(g.Encode()); n++ {
		if _, err := DecodeGPUArena(g.Encode()[:n]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("truncated to %d accepted", n)
		}
	}
	z := g
	z.SlabBytes = 3
	if _, err := DecodeGPUArena(z.Encode()); !errors.Is(err, ErrMalformed) {
		t.Fatalf("slab not dividing size accepted")
	}
	if CheckSlot(^uint64(0), 2, 10) == nil || CheckSlot(8, 2, 10) != nil || CheckSlot(9, 2, 10) == nil {
		t.Fatal("CheckSlot")
	}
}

func FuzzDecodeGPUArena(f *testing.F) {
	g := GPUArena{Size: 64 << 20, SlabBytes: 8 << 20}
	f.Add(g.Encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		a, err := DecodeGPUArena(p)
		if err != nil {
			return
		}
		if a.Size == 0 || a.SlabBytes == 0 || a.Size%a.SlabBytes != 0 {
			t.Fatalf("accepted bad geometry %+v", a)
		}
		if !bytes.Equal(a.Encode(), p) {
			t.Fatal("accepted payload does not re-encode identically")
		}
	})
}
