package shm

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkRingRoundTrip measures one nop through both rings: client push →
// daemon pop + push → client pop, with the daemon on its own goroutine.
// "spin" lets both sides spin before sleeping; "futex" makes every wait
// sleep, so each round trip pays two doorbells.
func BenchmarkRingRoundTrip(b *testing.B) {
	for _, bc := range []struct {
		name string
		spin time.Duration
	}{
		{"spin", 50 * time.Microsecond},
		{"futex", 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := RingLayout{Entries: 64, DataSize: 4096}
			c, d := heapRings(b, l)
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				in := make([]SQE, l.Entries)
				out := make([]CQE, l.Entries)
				for !stop.Load() {
					d.DaemonWait(bc.spin, 50*time.Millisecond)
					space, err := d.DaemonCQSpace()
					if err != nil {
						panic(err)
					}
					n, err := d.DaemonPop(in[:space])
					if err != nil {
						panic(err)
					}
					for i := 0; i < n; i++ {
						out[i] = CQE{UserData: in[i].UserData}
					}
					if n > 0 {
						d.DaemonPush(out[:n])
					}
				}
			}()
			sq := []SQE{{Op: OpNop}}
			cq := make([]CQE, 1)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sq[0].UserData = uint64(i)
				if c.ClientPush(sq) != 1 {
					b.Fatal("ring full")
				}
				c.ClientWake()
				for c.ClientPop(cq) == 0 {
					c.ClientWait(bc.spin, 50*time.Millisecond, nil)
				}
				if cq[0].UserData != uint64(i) {
					b.Fatalf("completion %d for %d", cq[0].UserData, i)
				}
			}
			b.StopTimer()
			stop.Store(true)
			d.DaemonInterrupt()
			wg.Wait()
		})
	}
}

func BenchmarkSQEEncodeDecode(b *testing.B) {
	buf := make([]byte, SQESize)
	e := SQE{Op: OpLookup, Count: 32, UserData: 7, Hash: Hash{1, 2}, Token: 3, Buf: 64, BufLen: 32 * 17}
	var d SQE
	b.SetBytes(SQESize)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		e.UserData = uint64(i)
		e.Encode(buf)
		d.Decode(buf)
	}
	if d.UserData != uint64(b.N-1) {
		b.Fatal("decode mismatch")
	}
}
