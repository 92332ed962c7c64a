//go:build !cuda

package tiers

import (
	"errors"
	"testing"

	"github.com/kvtier/kvtier/cudaipc"
)

// noPeer is a device that reaches no peer's memory.
type noPeer struct{ cudaipc.Device }

func (noPeer) CanAccessPeer(cudaipc.Device) (bool, error) { return false, nil }

// failDtoH is a device whose device-to-host copies fail.
type failDtoH struct{ cudaipc.Device }

func (failDtoH) CopyDtoHAsync([]byte, cudaipc.DevicePtr, cudaipc.Stream) error {
	return errors.New("injected D2H failure")
}

// TestGPUServedReadIsHitOfItsGPU: a get served from a GPU's copy by a reader
// elsewhere (a host-API reader, or a device reader on another GPU, by peer
// copy or through the host tier) is a hit of that GPU, as docs/metrics.md
// counts hits: the gets the tier served. Each tier asked and missing counts
// one miss; a copy that fails serves nothing and counts no hit. It used to
// count no hit anywhere: a served get looked like a miss of the whole chain.
func TestGPUServedReadIsHitOfItsGPU(t *testing.T) {
	type counts struct{ hostHits, hostMisses, g0Hits, g0Misses, g1Hits, g1Misses uint64 }
	for _, tc := range []struct {
		name   string
		gpu    int
		device bool
		wrap   func(cudaipc.Device) cudaipc.Device // GPU 0's device
		fails  bool
		want   counts
	}{
		{name: "host API", gpu: -1, want: counts{hostMisses: 1, g0Hits: 1}},
		{name: "host API on a GPU session", gpu: 1, want: counts{hostMisses: 1, g0Hits: 1}},
		{name: "device read on another GPU, peer copy", gpu: 1, device: true, want: counts{g0Hits: 1, g1Misses: 1}},
		{name: "device read on another GPU, no peer access", gpu: 1, device: true,
			wrap: func(d cudaipc.Device) cudaipc.Device { return noPeer{d} },
			want: counts{hostMisses: 1, g0Hits: 1, g1Misses: 1}},
		{name: "host API, copy fails", gpu: -1, fails: true,
			wrap: func(d cudaipc.Device) cudaipc.Device { return failDtoH{d} },
			want: counts{hostMisses: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newGPURig(t, true)
			g0, g1 := r.gs.GPUs[0], r.gs.GPUs[1]
			k := chainKey(64, 1)
			if at := r.put(t, k, 0); at != g0.Slots {
				t.Fatal("put did not land on GPU 0")
			}
			if tc.wrap != nil {
				dev := g0.Dev
				g0.Dev = tc.wrap(dev)
				defer func() { g0.Dev = dev }()
			}
			snap := func() counts {
				h, a, b := r.h.Stats(), g0.Slots.Stats(), g1.Slots.Stats()
				return counts{h.Hits, h.Misses, a.Hits, a.Misses, b.Hits, b.Misses}
			}
			before := snap()
			hd, err := r.acquire(t, k, tc.gpu, tc.device)
			if tc.fails {
				if err == nil {
					hd.Owner().Release(hd)
					t.Fatal("read served although its copy failed")
				}
			} else {
				if err != nil {
					t.Fatalf("read of a GPU-resident block: %v", err)
				}
				hd.Owner().Release(hd)
			}
			after := snap()
			got := counts{after.hostHits - before.hostHits, after.hostMisses - before.hostMisses,
				after.g0Hits - before.g0Hits, after.g0Misses - before.g0Misses,
				after.g1Hits - before.g1Hits, after.g1Misses - before.g1Misses}
			if got != tc.want {
				t.Fatalf("counted %+v, want %+v", got, tc.want)
			}
		})
	}
}
