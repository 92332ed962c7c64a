package memcopy

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
)

func fill(b []byte, seed byte) {
	x := uint32(seed)*2654435761 | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

func TestToHot(t *testing.T) {
	for _, tc := range []struct{ dst, src int }{
		{0, 0}, {1, 1}, {0, 5}, {5, 0},
		{chunk - 1, chunk - 1}, {chunk, chunk}, {chunk + 1, chunk + 1},
		{2 << 20, 2 << 20}, {2<<20 + 3, 2<<20 + 3},
		{chunk + 7, 3 * chunk}, {3 * chunk, chunk + 7}, // lengths differ: min is copied
	} {
		t.Run(fmt.Sprintf("%d<-%d", tc.dst, tc.src), func(t *testing.T) {
			src, dst, want := make([]byte, tc.src), make([]byte, tc.dst), make([]byte, tc.dst)
			fill(src, 1)
			fill(dst, 2)
			copy(want, dst)
			wn := copy(want, src)
			if n := ToHot(dst, src); n != wn {
				t.Fatalf("copied %d bytes, want %d", n, wn)
			}
			if !bytes.Equal(dst, want) {
				t.Fatal("destination differs from copy's result")
			}
		})
	}
}

// TestToHotOverlapForward: like copy, overlapping slices of one array come out as
// if src had been read first whenever dst starts before src (a forward
// copy, which is how the chunks are walked).
func TestToHotOverlapForward(t *testing.T) {
	buf, want := make([]byte, 3*chunk), make([]byte, 3*chunk)
	fill(buf, 3)
	copy(want, buf)
	copy(want[:2*chunk], want[chunk/2:chunk/2+2*chunk])
	ToHot(buf[:2*chunk], buf[chunk/2:chunk/2+2*chunk])
	if !bytes.Equal(buf, want) {
		t.Fatal("forward overlapping copy differs from copy's")
	}
}

// BenchmarkPutGet copies a 2 MiB block into rotating cold slots and back out
// into one reused buffer (the client's Put+Get), out-copy by copy or by
// ToHot, with 1 and 4 goroutines. Compare the pairs of one run: a
// 2-vCPU VM's bandwidth drifts between runs.
func BenchmarkPutGet(b *testing.B) {
	const block, slots = 2 << 20, 64
	for _, par := range []int{1, 4} {
		for _, v := range []struct {
			name string
			out  func(dst, src []byte) int
		}{{"copy", func(d, s []byte) int { return copy(d, s) }}, {"ToHot", ToHot}} {
			b.Run(fmt.Sprintf("workers=%d/out=%s", par, v.name), func(b *testing.B) {
				b.SetBytes(2 * block)
				type ws struct{ src, dst, arena []byte }
				w := make([]ws, par)
				for i := range w {
					w[i] = ws{make([]byte, block), make([]byte, block), make([]byte, slots*block)}
					fill(w[i].src, byte(i))
					fill(w[i].arena, byte(i+1))
				}
				var next sync.Mutex
				n := 0
				b.ResetTimer()
				var wg sync.WaitGroup
				for i := range w {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for j := 0; ; j++ {
							next.Lock()
							if n >= b.N {
								next.Unlock()
								return
							}
							n++
							next.Unlock()
							s := w[i].arena[(j%slots)*block:][:block]
							copy(s, w[i].src)
							v.out(w[i].dst, s)
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}
