//go:build !cuda

package tiers

import (
	"errors"
	"testing"
	"time"

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

// TestGPUFailedPromotionIsNoHostHit: a device read of a host block whose
// promotion then fails (the block was deleted before the promotion ran, or
// the GPU tier is stopped) was served by no tier and counts no host hit;
// it used to count one when the promotion was queued.
func TestGPUFailedPromotionIsNoHostHit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before func(r *gpuRig, k Key) // before the read
		after  func(r *gpuRig, k Key) // after it, before its promotion runs
	}{
		{name: "deleted", after: func(r *gpuRig, k Key) {
			if !r.gs.Delete(k) {
				t.Fatal("delete found nothing")
			}
		}},
		{name: "stopped", before: func(r *gpuRig, k Key) {
			r.gs.imu.Lock()
			r.gs.stopped = true
			r.gs.imu.Unlock()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newGPURig(t, false) // no workers: the promotion waits in the queue
			k := chainKey(66, 1)
			if at := r.put(t, k, -1); at != r.h {
				t.Fatal("block not put to the host tier")
			}
			if tc.before != nil {
				tc.before(r, k)
			}
			hits := r.h.Stats().Hits
			type res struct {
				hd  *Handle
				err error
			}
			got := make(chan res, 1)
			if hd, ok := r.gs.Acquire(k, gpuBlock, 0, true, func(hd *Handle, err error) { got <- res{hd, err} }); hd != nil || !ok {
				t.Fatalf("device read of a host block with room on the GPU: lease %v, ok %v; want a promotion", hd != nil, ok)
			}
			if tc.after != nil {
				tc.after(r, k)
			}
			select {
			case f := <-r.gs.jobs:
				f()
			default:
			}
			var x res
			select {
			case x = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("the read was never answered")
			}
			if x.err == nil {
				x.hd.Owner().Release(x.hd)
				t.Fatal("the read was served")
			}
			if d := r.h.Stats().Hits - hits; d != 0 {
				t.Fatalf("host hits rose by %d for a read that failed (%v), want 0", d, x.err)
			}
		})
	}
}
