//go:build !cuda

package tiers

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// gpuRig is a GPU set on emulated devices over a host-only chain.
type gpuRig struct {
	gs     *GPUSet
	c      *Chain
	h      *Host
	cancel context.CancelFunc
}

const (
	gpuArena = 8 << 20
	gpuBlock = 256 << 10
)

func newGPURig(t *testing.T, start bool) *gpuRig { return newGPURigN(t, 2, start) }

// newGPURigN is a rig with n emulated GPUs of gpuArena bytes (n < 10).
func newGPURigN(t *testing.T, n int, start bool) *gpuRig {
	t.Helper()
	return newGPURigOpts(t, gpuRigOpts{gpus: n, start: start})
}

// gpuRigOpts are what the GPU rigs of the tests vary; zero fields take
// the defaults.
type gpuRigOpts struct {
	gpus              int     // emulated GPUs of gpuArena bytes (n < 10); 1
	hostSlab, gpuSlab int64   // 1 MiB
	high, low         float64 // the GPU watermarks: 0.75 and 0.5
	store             *nvme.Store
	start             bool // run the movers (stopped at the end of t)
}

// newGPURigOpts is a rig over a 32 MiB host tier.
func newGPURigOpts(t *testing.T, o gpuRigOpts) *gpuRig {
	t.Helper()
	o.gpus = max(o.gpus, 1)
	if o.hostSlab == 0 {
		o.hostSlab = 1 << 20
	}
	if o.gpuSlab == 0 {
		o.gpuSlab = 1 << 20
	}
	if o.high == 0 {
		o.high, o.low = 0.75, 0.5
	}
	t.Setenv(cudaipc.EnvEmulatedGPUs, string(rune('0'+o.gpus))+":64MiB")
	devs, err := cudaipc.Devices()
	if err != nil {
		t.Fatal(err)
	}
	arena, err := unix.Mmap(-1, 0, 32<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(arena, HostConfig{SlabBytes: o.hostSlab})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewChain(h, o.store, ChainConfig{Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	sizes := make([]int64, o.gpus)
	for i := range sizes {
		sizes[i] = gpuArena
	}
	gs, err := NewGPUSet(c, arena, devs, sizes, GPUConfig{
		SlabBytes: o.gpuSlab, HighWatermark: o.high, LowWatermark: o.low, Workers: 2, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	r := &gpuRig{gs: gs, c: c, h: h}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	if o.start {
		c.Start(ctx)
		gs.Start(ctx)
	}
	t.Cleanup(func() {
		cancel()
		if o.start {
			gs.Wait()
			c.Wait()
		}
		gs.Close()
		unix.Munmap(arena)
	})
	return r
}

// put stores k through the GPU set's reservation (device writer on gpu).
func (r *gpuRig) put(t *testing.T, k Key, gpu int) *Host {
	t.Helper()
	return r.putSized(t, k, gpuBlock, gpu)
}

// putSized is put of a block of size bytes; it returns the tier that took it.
func (r *gpuRig) putSized(t *testing.T, k Key, size int64, gpu int) *Host {
	t.Helper()
	hd, err := r.gs.Reserve(k, size, gpu)
	if err != nil {
		t.Fatalf("reserve %v: %v", k, err)
	}
	b := blockFor(k, size)
	if g := r.gs.GPUOf(hd); g != nil {
		if err := g.run(func(s cudaipc.Stream) error { return g.Dev.CopyHtoDAsync(g.ptr(hd.Offset), b, s) }); err != nil {
			t.Fatal(err)
		}
		if err := g.Slots.Commit(hd); err != nil {
			t.Fatal(err)
		}
		r.gs.Committed(g)
		return g.Slots
	}
	copy(r.h.Bytes(hd), b)
	if err := r.h.Commit(hd); err != nil {
		t.Fatal(err)
	}
	return r.h
}

// read returns the bytes of the committed copy of k in tier at.
func (r *gpuRig) read(t *testing.T, at *Host, k Key) ([]byte, bool) {
	t.Helper()
	hd, ok := at.Pin(k)
	if !ok {
		return nil, false
	}
	defer at.Unpin(hd, false)
	out := make([]byte, hd.Size)
	for _, g := range r.gs.GPUs {
		if g.Slots == at {
			if err := g.run(func(s cudaipc.Stream) error { return g.Dev.CopyDtoHAsync(out, g.ptr(hd.Offset), s) }); err != nil {
				t.Fatal(err)
			}
			return out, true
		}
	}
	copy(out, at.Bytes(hd))
	return out, true
}

func (r *gpuRig) mustHold(t *testing.T, at *Host, k Key, where string) {
	t.Helper()
	b, ok := r.read(t, at, k)
	if !ok {
		t.Fatalf("%v not in the %s tier", k, where)
	}
	if !bytes.Equal(b, blockFor(k, gpuBlock)) {
		t.Fatalf("%v: bytes differ in the %s tier", k, where)
	}
}

// acquire leases k for a device reader on gpu, waiting for a deferred copy.
func (r *gpuRig) acquire(t *testing.T, k Key, gpu int, device bool) (*Handle, error) {
	t.Helper()
	type res struct {
		hd  *Handle
		err error
	}
	ch := make(chan res, 1)
	hd, ok := r.gs.Acquire(k, gpuBlock, gpu, device, func(hd *Handle, err error) { ch <- res{hd, err} })
	if hd != nil {
		return hd, nil
	}
	if !ok {
		return nil, errors.New("miss")
	}
	select {
	case x := <-ch:
		return x.hd, x.err
	case <-time.After(10 * time.Second):
		t.Fatal("deferred acquire never completed")
		return nil, nil
	}
}

func TestGPUReserveCommitAcquire(t *testing.T) {
	r := newGPURig(t, true)
	g0 := r.gs.GPUs[0]
	k := chainKey(1, 1)
	if at := r.put(t, k, 0); at != g0.Slots {
		t.Fatal("a device put with room did not land in GPU 0's arena")
	}
	if _, err := r.gs.Reserve(k, gpuBlock, 1); !errors.Is(err, ErrExists) {
		t.Fatalf("second reserve on another GPU: %v, want ErrExists", err)
	}
	out := make([]shm.Tier, 1)
	if hits, _ := r.gs.Lookup([]Key{k}, out); hits != 1 || out[0] != shm.TierGPU {
		t.Fatalf("lookup: %d hits, tier %v", hits, out[0])
	}
	hd, err := r.acquire(t, k, 0, true)
	if err != nil || hd.Owner() != g0.Slots {
		t.Fatalf("acquire on GPU 0: %v (owner gpu %v)", err, hd != nil && hd.Owner() == g0.Slots)
	}
	g0.Slots.Release(hd)
	r.mustHold(t, g0.Slots, k, "gpu0")
	if st := r.gs.Stats(); st.Devices[0].Blocks != 1 || st.Devices[0].Hits != 1 {
		t.Fatalf("gpu0 stats: %+v", st.Devices[0])
	}
	// A host-API reader gets a copy in the host tier (D2H); the GPU copy stays.
	hd, err = r.acquire(t, k, -1, false)
	if err != nil || hd.Owner() != r.h {
		t.Fatalf("host acquire: %v", err)
	}
	r.h.Release(hd)
	r.mustHold(t, r.h, k, "host")
	r.mustHold(t, g0.Slots, k, "gpu0")
	if st := r.gs.Stats(); st.GPUToHost.Blocks != 1 || st.GPUToHost.Bytes != gpuBlock {
		t.Fatalf("gpu→host move stats: %+v", st.GPUToHost)
	}
}

func TestGPUDemotionKeepsBytes(t *testing.T) {
	r := newGPURig(t, true)
	g0 := r.gs.GPUs[0]
	// Fill GPU 0 past its high watermark (0.75 of 8 MiB) behind Reserve's
	// back, so that the demoter must bring it down to the low one.
	var keys []Key
	var leased *Handle
	for i := range uint64(28) { // 7 MiB
		k := chainKey(2, i)
		hd, err := g0.Slots.Reserve(k, gpuBlock)
		if err != nil {
			t.Fatal(err)
		}
		b := blockFor(k, gpuBlock)
		if err := g0.run(func(s cudaipc.Stream) error { return g0.Dev.CopyHtoDAsync(g0.ptr(hd.Offset), b, s) }); err != nil {
			t.Fatal(err)
		}
		g0.Slots.Commit(hd)
		keys = append(keys, k)
		if i == 0 {
			// Lease the oldest block before the tier crosses its high
			// watermark (the demoter's own tick could take it otherwise):
			// a leased block is never demoted.
			var ok bool
			if leased, ok = g0.Slots.Acquire(k); !ok {
				t.Fatal("acquire keys[0]")
			}
		}
	}
	r.gs.Committed(g0)
	deadline := time.Now().Add(5 * time.Second)
	for {
		used, capacity := g0.Slots.Usage()
		if float64(used) <= 0.5*float64(capacity) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("demoter left %d of %d bytes", used, capacity)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !g0.Slots.Contains(keys[0]) {
		t.Fatal("the leased block was demoted")
	}
	g0.Slots.Release(leased)
	demoted := 0
	for _, k := range keys {
		switch {
		case g0.Slots.Contains(k):
			r.mustHold(t, g0.Slots, k, "gpu0")
		default:
			r.mustHold(t, r.h, k, "host")
			demoted++
		}
	}
	st := r.gs.Stats()
	if demoted == 0 || st.Demotions[0] != uint64(demoted) || st.GPUToHost.Bytes != uint64(demoted)*gpuBlock || st.GPUToHost.Errors != 0 {
		t.Fatalf("%d demoted; stats %+v", demoted, st)
	}
}

func TestGPUPromotionAndMigration(t *testing.T) {
	r := newGPURig(t, true)
	g0, g1 := r.gs.GPUs[0], r.gs.GPUs[1]
	k := chainKey(3, 1)
	if at := r.put(t, k, -1); at != r.h {
		t.Fatal("a host put landed in a GPU")
	}
	// Host → GPU 0 on a device read.
	hd, err := r.acquire(t, k, 0, true)
	if err != nil || hd.Owner() != g0.Slots {
		t.Fatalf("promotion: %v", err)
	}
	g0.Slots.Release(hd)
	r.mustHold(t, g0.Slots, k, "gpu0")
	r.mustHold(t, r.h, k, "host")
	// GPU 0 → GPU 1 by a peer copy; the source copy is dropped.
	hd, err = r.acquire(t, k, 1, true)
	if err != nil || hd.Owner() != g1.Slots {
		t.Fatalf("migration: %v", err)
	}
	g1.Slots.Release(hd)
	r.mustHold(t, g1.Slots, k, "gpu1")
	if g0.Slots.Contains(k) {
		t.Fatal("migration left the source copy")
	}
	st := r.gs.Stats()
	if st.HostToGPU.Blocks != 1 || st.HostToGPU.Bytes != gpuBlock || st.GPUToGPU.Blocks != 1 || st.GPUToGPU.Bytes != gpuBlock {
		t.Fatalf("move stats: up %+v peer %+v", st.HostToGPU, st.GPUToGPU)
	}
	// Delete removes every copy.
	if !r.gs.Delete(k) {
		t.Fatal("delete found nothing")
	}
	for i, g := range r.gs.GPUs {
		if g.Slots.Present(k) {
			t.Fatalf("gpu %d still holds the deleted block", i)
		}
	}
	if r.h.Present(k) {
		t.Fatal("host still holds the deleted block")
	}
}

// A Delete that lands while a copy is in flight wins: the copy does not
// bring the block back (demotion, promotion and migration).
func TestGPUDeleteRacesCopy(t *testing.T) {
	gone := func(r *gpuRig, k Key) bool {
		for _, g := range r.gs.GPUs {
			if g.Slots.Present(k) {
				return false
			}
		}
		return !r.h.Present(k)
	}
	t.Run("demotion", func(t *testing.T) {
		r := newGPURig(t, false)
		g0 := r.gs.GPUs[0]
		k := chainKey(4, 1)
		r.put(t, k, 0)
		r.gs.copied = func(x Key) { r.gs.Delete(x) }
		if n, _ := r.gs.demoteBatch(g0, 8); n != 0 {
			t.Fatalf("demoted %d", n)
		}
		if !gone(r, k) {
			t.Fatal("a demotion brought the deleted block back")
		}
	})
	t.Run("promotion", func(t *testing.T) {
		r := newGPURig(t, true)
		k := chainKey(4, 2)
		r.put(t, k, -1)
		r.gs.copied = func(x Key) { r.gs.Delete(x) }
		if hd, err := r.acquire(t, k, 0, true); err == nil {
			t.Fatalf("acquire of a block deleted during its promotion got a lease in %p", hd.Owner())
		}
		if !gone(r, k) {
			t.Fatal("a promotion brought the deleted block back")
		}
	})
	t.Run("migration", func(t *testing.T) {
		r := newGPURig(t, true)
		k := chainKey(4, 3)
		r.put(t, k, 0)
		r.gs.copied = func(x Key) { r.gs.Delete(x) }
		if _, err := r.acquire(t, k, 1, true); err == nil {
			t.Fatal("acquire of a block deleted during its migration got a lease")
		}
		if !gone(r, k) {
			t.Fatal("a migration brought the deleted block back")
		}
	})
	t.Run("deleteNS", func(t *testing.T) {
		r := newGPURig(t, false)
		k := chainKey(5, 1)
		r.put(t, k, 0)
		r.gs.copied = func(x Key) { r.gs.DeleteNS(x.NS) }
		r.gs.demoteBatch(r.gs.GPUs[0], 8)
		if !gone(r, k) {
			t.Fatal("a demotion brought a block of a deleted namespace back")
		}
	})
}

// belowLow reports whether g's arena is at or under its low watermark.
func (g *GPU) belowLow() bool {
	used, capacity := g.Slots.Usage()
	return float64(used) <= g.set.cfg.LowWatermark*float64(capacity)
}

// Under a steady stream of device puts the GPU keeps the most recent blocks:
// a reservation that finds the arena at its high watermark falls back to the
// host tier without waiting, but kicks the demoter, which moves the coldest
// blocks down so that later puts land on the GPU again.
func TestGPUStreamKeepsRecentBlocks(t *testing.T) {
	r := newGPURig(t, true)
	g0 := r.gs.GPUs[0]
	const n = 96 // three GPU arenas' worth
	keys := make([]Key, n)
	onGPU := make([]bool, n)
	fallbacks := 0
	for i := range keys {
		keys[i] = chainKey(6, uint64(i))
		t0 := time.Now()
		at := r.put(t, keys[i], 0)
		onGPU[i] = at == g0.Slots
		if onGPU[i] {
			continue
		}
		fallbacks++
		if d := time.Since(t0); d > time.Second {
			t.Fatalf("a put that fell back to the host tier took %v", d)
		}
		// The next put of the stream comes a little later: by then the
		// demoter has brought the GPU down to its low watermark. (Waiting
		// only for room for one block let the next puts overtake the
		// demoter mid-pass and fall back too, about one run in ten
		// without -race.)
		deadline := time.Now().Add(5 * time.Second)
		for !g0.belowLow() {
			if time.Now().After(deadline) {
				used, capacity := g0.Slots.Usage()
				t.Fatalf("put %d fell back to the host tier and the GPU never found room again (%d of %d bytes used)", i, used, capacity)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if fallbacks == 0 || fallbacks > n/4 {
		t.Fatalf("%d of %d puts fell back to the host tier", fallbacks, n)
	}
	// Recency: every block still on the GPU is newer than every block that
	// left it; the oldest are in the host tier, the newest on the GPU.
	out := make([]shm.Tier, 1)
	tier := func(k Key) shm.Tier {
		if hits, _ := r.gs.Lookup([]Key{k}, out); hits != 1 {
			t.Fatalf("%v: lookup missed", k)
		}
		return out[0]
	}
	newestLeft := -1
	for i, k := range keys {
		if onGPU[i] && !g0.Slots.Contains(k) {
			newestLeft = i
		}
	}
	for i, k := range keys {
		if g0.Slots.Contains(k) {
			if i < newestLeft {
				t.Fatalf("block %d is still on the GPU but the newer block %d was demoted", i, newestLeft)
			}
			if tier(k) != shm.TierGPU {
				t.Fatalf("block %d: lookup reports %v, want gpu", i, out[0])
			}
			r.mustHold(t, g0.Slots, k, "gpu0")
			continue
		}
		if tier(k) == shm.TierGPU {
			t.Fatalf("block %d: lookup reports gpu but GPU 0 does not hold it", i)
		}
		r.mustHold(t, r.h, k, "host")
	}
	for i := range 8 {
		if g0.Slots.Contains(keys[i]) || tier(keys[i]) == shm.TierGPU {
			t.Fatalf("old block %d is still on the GPU", i)
		}
	}
	gpuTail := 0
	for i := n - 8; i < n; i++ {
		if !onGPU[i] {
			continue // fell back: the GPU was at its high watermark then
		}
		if tier(keys[i]) != shm.TierGPU {
			t.Fatalf("recent block %d: lookup reports %v, want gpu", i, out[0])
		}
		gpuTail++
	}
	if gpuTail < 7 {
		t.Fatalf("only %d of the last 8 puts landed on the GPU", gpuTail)
	}
	if st := r.gs.Stats(); st.Demotions[0] == 0 || st.GPUToHost.Errors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// waitFor polls cond (state another goroutine changes) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A device read of a host block when GPU 0's arena is full: served from the
// host tier at once (no deferred completion: the ring loop never waits),
// counted, and the demoter is kicked; it moves only unleased blocks, and once
// it made room the next device read promotes the block into the arena.
func TestGPUPromotionIntoFullArena(t *testing.T) {
	tests := []struct {
		name   string
		leased bool // every GPU block is leased: the demoter cannot move any
	}{
		{"unleased arena", false},
		{"leased arena", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newGPURig(t, true)
			g0 := r.gs.GPUs[0]
			// Fill GPU 0 to its high watermark exactly (0.75 of 8 MiB): not
			// above it, so the demoter has no reason of its own to run, and
			// no room for one more block.
			var gpuKeys []Key
			var leases []*Handle
			for i := range uint64(24) {
				k := chainKey(7, i)
				if at := r.put(t, k, 0); at != g0.Slots {
					t.Fatalf("fill block %d landed outside GPU 0", i)
				}
				gpuKeys = append(gpuKeys, k)
				if tc.leased {
					hd, ok := g0.Slots.Acquire(k)
					if !ok {
						t.Fatalf("lease fill block %d", i)
					}
					leases = append(leases, hd)
				}
			}
			if g0.hasRoom(gpuBlock) {
				t.Fatal("the arena has room after the fill")
			}
			k := chainKey(8, 1)
			r.put(t, k, -1)
			passes := g0.passes.Load()

			read := func() *Handle {
				t.Helper()
				hd, ok := r.gs.Acquire(k, gpuBlock, 0, true, func(*Handle, error) {
					t.Error("a fallback read was deferred")
				})
				if !ok || hd == nil {
					t.Fatalf("device read of a host block: handle %v, ok %v; want an immediate host lease", hd, ok)
				}
				return hd
			}
			hd := read()
			if hd.Owner() != r.h {
				t.Fatal("the fallback lease is not in the host tier")
			}
			r.h.Release(hd)
			if st := r.gs.Stats(); st.PromotionFallbacks[0] != 1 || st.HostToGPU.Blocks != 0 {
				t.Fatalf("after one fallback: fallbacks %v, promotions %+v", st.PromotionFallbacks, st.HostToGPU)
			}
			// The kick runs a demoter pass under pressure.
			waitFor(t, "a demoter pass", func() bool { return g0.passes.Load() > passes })
			if tc.leased {
				for i, gk := range gpuKeys {
					if !g0.Slots.Contains(gk) {
						t.Fatalf("leased block %d left the GPU", i)
					}
					r.mustHold(t, g0.Slots, gk, "gpu0")
				}
				if st := r.gs.Stats(); st.Demotions[0] != 0 || g0.hasRoom(gpuBlock) {
					t.Fatalf("demoted %d leased blocks", st.Demotions[0])
				}
				// Still no room: served from the host tier again.
				hd := read()
				if hd.Owner() != r.h {
					t.Fatal("a read with the arena full of leased blocks was not served from the host tier")
				}
				r.h.Release(hd)
				for _, l := range leases {
					g0.Slots.Release(l)
				}
				// The second fallback kicked the demoter again; now the
				// blocks are free to go.
			}
			// Under pressure the demoter goes down to the low watermark
			// (0.5), then stops: the arena is not above its high one.
			waitFor(t, "the low watermark", func() bool {
				used, capacity := g0.Slots.Usage()
				return float64(used) <= 0.5*float64(capacity)
			})
			hd, err := r.acquire(t, k, 0, true)
			if err != nil || hd.Owner() != g0.Slots {
				t.Fatalf("device read after the demoter made room: %v (on GPU %v)", err, hd != nil && hd.Owner() == g0.Slots)
			}
			g0.Slots.Release(hd)
			r.mustHold(t, g0.Slots, k, "gpu0")
			r.mustHold(t, r.h, k, "host")
			// The demoter moved the coldest blocks first, every byte
			// intact. Stop it (its last batch may still be counting) so
			// that the counters hold still.
			r.cancel()
			r.gs.Wait()
			st := r.gs.Stats()
			wantFallbacks := uint64(1)
			if tc.leased {
				wantFallbacks = 2
			}
			if st.PromotionFallbacks[0] != wantFallbacks || st.HostToGPU.Blocks != 1 || st.HostToGPU.Bytes != gpuBlock {
				t.Fatalf("fallbacks %v (want %d), promotions %+v", st.PromotionFallbacks, wantFallbacks, st.HostToGPU)
			}
			demoted := 0
			for i, gk := range gpuKeys {
				if g0.Slots.Contains(gk) {
					r.mustHold(t, g0.Slots, gk, "gpu0")
					continue
				}
				if demoted != i {
					t.Fatalf("block %d was demoted but the older block %d was not", i, demoted)
				}
				r.mustHold(t, r.h, gk, "host")
				demoted++
			}
			if demoted < 8 || st.Demotions[0] != uint64(demoted) || st.GPUToHost.Errors != 0 {
				t.Fatalf("%d demoted; stats %+v", demoted, st)
			}
		})
	}
}

// A promoted (or migrated) block is committed pinned: between its commit and
// the readers' leases the demoter, which picks unleased blocks, cannot take
// it (a deferred acquire then answered a miss for a cached block).
func TestGPUMoveCommitsPinned(t *testing.T) {
	tests := []struct {
		name string
		move func(r *gpuRig, k Key) (*Host, *Handle, error)
		dst  func(r *gpuRig) *Host
	}{
		{"promotion", func(r *gpuRig, k Key) (*Host, *Handle, error) {
			r.put(t, k, -1)
			src, ok := r.h.Pin(k)
			if !ok {
				return nil, nil, errors.New("host copy not pinned")
			}
			return r.gs.promote(r.gs.GPUs[0], k, src, &gpuMove{})
		}, func(r *gpuRig) *Host { return r.gs.GPUs[0].Slots }},
		{"migration", func(r *gpuRig, k Key) (*Host, *Handle, error) {
			r.put(t, k, 0)
			return r.gs.migrate(r.gs.GPUs[0], r.gs.GPUs[1], k, gpuBlock)
		}, func(r *gpuRig) *Host { return r.gs.GPUs[1].Slots }},
		// A reader that wants host memory gets a D2H copy; the host →
		// NVMe mover picks unleased host blocks the same way.
		{"copy to host", func(r *gpuRig, k Key) (*Host, *Handle, error) {
			r.put(t, k, 0)
			return r.gs.viaHost(r.gs.GPUs[0], k, gpuBlock)
		}, func(r *gpuRig) *Host { return r.h }},
		{"copy to host, already there", func(r *gpuRig, k Key) (*Host, *Handle, error) {
			r.put(t, k, 0)
			if _, _, err := r.gs.viaHost(r.gs.GPUs[0], k, gpuBlock); err != nil {
				return nil, nil, err
			}
			hd, ok := r.h.Pin(k)
			if !ok {
				return nil, nil, errors.New("first copy not in the host tier")
			}
			r.h.Unpin(hd, false) // the first mover's pin
			r.h.Unpin(hd, false)
			return r.gs.viaHostAny(k, gpuBlock)
		}, func(r *gpuRig) *Host { return r.h }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newGPURig(t, false)
			k := chainKey(9, 1)
			at, held, err := tc.move(r, k)
			if err != nil || at != tc.dst(r) || held == nil || held.Key != k {
				t.Fatalf("move: tier ok %v, held %v, %v", at == tc.dst(r), held != nil, err)
			}
			if got := at.PinColdest(8, nil); len(got) != 0 {
				t.Fatalf("the demoter could pick %d blocks while the mover held the new copy", len(got))
			}
			if _, err := at.Unpin(held, false); err != nil {
				t.Fatal(err)
			}
			got := at.PinColdest(8, nil)
			if len(got) != 1 || got[0].Key != k {
				t.Fatalf("after the mover let go: %d candidates", len(got))
			}
			at.Unpin(got[0], false)
			r.mustHold(t, at, k, "destination")
		})
	}
}
