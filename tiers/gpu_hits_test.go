//go:build !cuda

package tiers

import "testing"

// TestGPUDeviceReadOfHostBlockIsHostHit: a device read that misses its
// GPU's arena and finds the block in the host tier is a GPU miss and a host
// hit, whether the block is then promoted into the arena (room) or served
// from the host tier (arena full): docs/metrics.md counts as host hits the
// gets the host tier served, and the host tier served both.
func TestGPUDeviceReadOfHostBlockIsHostHit(t *testing.T) {
	for _, tc := range []struct {
		name string
		full bool
	}{
		{"promoted", false},
		{"arena full", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newGPURig(t, true)
			g0 := r.gs.GPUs[0]
			if tc.full {
				var leases []*Handle // leased: the demoter cannot make room
				for i := uint64(0); g0.hasRoom(gpuBlock); i++ {
					k := chainKey(7, i)
					if at := r.put(t, k, 0); at != g0.Slots {
						t.Fatalf("fill block %d landed outside GPU 0", i)
					}
					hd, ok := g0.Slots.Acquire(k)
					if !ok {
						t.Fatal("lease of a fill block")
					}
					leases = append(leases, hd)
				}
				defer func() {
					for _, hd := range leases {
						g0.Slots.Release(hd)
					}
				}()
			}
			k := chainKey(8, 1)
			if at := r.put(t, k, -1); at != r.h {
				t.Fatal("block not put to the host tier")
			}
			hb, gb := r.h.Stats(), g0.Slots.Stats()
			hd, err := r.acquire(t, k, 0, true)
			if err != nil {
				t.Fatalf("device read of a host block: %v", err)
			}
			defer hd.Owner().Release(hd)
			if wantGPU := !tc.full; (hd.Owner() == g0.Slots) != wantGPU {
				t.Fatalf("read served from %p, GPU 0 is %p (full arena: %v)", hd.Owner(), g0.Slots, tc.full)
			}
			ha, ga := r.h.Stats(), g0.Slots.Stats()
			if d := ha.Hits - hb.Hits; d != 1 {
				t.Errorf("host hits rose by %d, want 1", d)
			}
			if d := ha.Misses - hb.Misses; d != 0 {
				t.Errorf("host misses rose by %d, want 0", d)
			}
			if d := ga.Misses - gb.Misses; d != 1 {
				t.Errorf("GPU 0 misses rose by %d, want 1", d)
			}
		})
	}
}
