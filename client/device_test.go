//go:build !cuda

package client_test

// The device API against an in-process daemon without a GPU tier: every
// device put and get goes through a host slot (D2H / H2D on the emulated
// device). A held stream (cudaipc.HoldStream) stands for the caller's
// kernels still running: the calls must return before their copies run, and
// the commit (put) or release (get) must wait for the event. GPU slots (D2D
// through the daemon's IPC-exported arena) need the daemon in another
// process: itest/gpu_test.go.

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cudaipc"
)

type devRig struct {
	c    *client.Client
	s    *client.Session
	dev  cudaipc.Device
	buf  cudaipc.Arena
	hs   []client.Hash
	bs   int
	sock string
}

func newDevRig(t *testing.T, n int) *devRig {
	t.Helper()
	// The daemon starts before the emulated GPU exists: its GPU tier is off,
	// and the client (same process) could not open its arena anyway.
	sock := startDaemon(t)
	dev := emulatedDevice(t)
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: sock, Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.Open(ctx, testNS())
	if err != nil {
		t.Fatal(err)
	}
	r := &devRig{c: c, s: s, dev: dev, bs: s.BlockBytes(), sock: sock,
		hs: client.ChainHashes(client.Hash{}, tokens(n*16, 77), 16)}
	// Source blocks at [0, n), destinations at [n, 2n).
	if r.buf, err = dev.Alloc(int64(2 * n * r.bs)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.buf.Free() })
	st := r.stream(t)
	host := make([]byte, n*r.bs)
	for i := range n {
		copy(host[i*r.bs:], r.payload(i))
	}
	if err := dev.CopyHtoDAsync(r.buf.Ptr(), host, st); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return r
}

// emulatedDevice opens an emulated GPU of 64 MiB for the test.
func emulatedDevice(t *testing.T) cudaipc.Device {
	t.Helper()
	t.Setenv(cudaipc.EnvEmulatedGPUs, "1:64MiB")
	devs, err := cudaipc.Devices()
	if err != nil {
		t.Fatal(err)
	}
	dev := devs[0]
	t.Cleanup(func() { dev.Close() })
	return dev
}

func (r *devRig) payload(i int) []byte {
	return bytes.Repeat([]byte{byte(i*7 + 1), byte(i)}, r.bs/2)
}

func (r *devRig) src(i int) cudaipc.DevicePtr { return r.buf.Ptr() + cudaipc.DevicePtr(i*r.bs) }
func (r *devRig) dst(i int) cudaipc.DevicePtr {
	return r.buf.Ptr() + cudaipc.DevicePtr((len(r.hs)+i)*r.bs)
}

func (r *devRig) stream(t *testing.T) cudaipc.Stream {
	t.Helper()
	st, err := r.dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// hold gates st until the returned release (also run at cleanup, before
// the stream closes: cleanups run last-registered first).
func hold(t *testing.T, st cudaipc.Stream) func() {
	t.Helper()
	release, err := cudaipc.HoldStream(st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return release
}

// readDev copies n bytes of device memory at p to the host on a stream of
// its own.
func (r *devRig) readDev(t *testing.T, p cudaipc.DevicePtr) []byte {
	t.Helper()
	st := r.stream(t)
	out := make([]byte, r.bs)
	if err := r.dev.CopyDtoHAsync(out, p, st); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return out
}

// host returns the daemon's host tier row.
func (r *devRig) host(t *testing.T) client.Stats {
	t.Helper()
	st, err := r.c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return *st
}

// waitHost polls the host tier row until cond holds (the daemon applies a
// release when its ring loop gets to it, after the client moved on).
func (r *devRig) waitHost(t *testing.T, what string, cond func(reserved, leased, blocks int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h := r.host(t).Tiers[0]
		if cond(h.Reserved, h.Leased, h.Blocks) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: host tier reserved=%d leased=%d blocks=%d", what, h.Reserved, h.Leased, h.Blocks)
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *devRig) hits(t *testing.T, n int) int {
	t.Helper()
	res, err := r.s.Lookup(context.Background(), r.hs[:n])
	if err != nil {
		t.Fatal(err)
	}
	return res.Hits
}

func (r *devRig) mustGet(t *testing.T, i int) {
	t.Helper()
	got := make([]byte, r.bs)
	if err := r.s.Get(context.Background(), r.hs[i], got); err != nil {
		t.Fatalf("get block %d: %v", i, err)
	}
	if !bytes.Equal(got, r.payload(i)) {
		t.Fatalf("block %d: bytes differ", i)
	}
}

func pending(op *client.DeviceOp) bool {
	select {
	case <-op.Done():
		return false
	default:
		return true
	}
}

func TestGPUDeviceAsync(t *testing.T) {
	const n = 4
	tests := []struct {
		name string
		run  func(t *testing.T, r *devRig)
	}{
		{"put commits at the event, not before", func(t *testing.T, r *devRig) {
			st := r.stream(t)
			release := hold(t, st)
			srcs := []cudaipc.DevicePtr{r.src(0), r.src(1), r.src(2), r.src(3)}
			op, err := r.s.PutFromDeviceBatch(context.Background(), r.hs, srcs, st)
			if err != nil {
				t.Fatal(err)
			}
			// The call returned with the copies queued behind the hold: the
			// slots are reserved, nothing is visible.
			if !pending(op) || op.Err() != nil || op.Stored() != 0 {
				t.Fatal("the op completed while its stream was held")
			}
			for i := range n {
				if op.Tier(i) != client.TierHost {
					t.Fatalf("block %d: slot in %v, want host (no GPU tier)", i, op.Tier(i))
				}
			}
			r.waitHost(t, "reserved while held", func(res, _, blocks int) bool { return res == n && blocks == 0 })
			if h := r.hits(t, n); h != 0 {
				t.Fatalf("%d blocks visible before their copies ran", h)
			}
			release()
			if err := op.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			if op.Stored() != n {
				t.Fatalf("stored %d of %d", op.Stored(), n)
			}
			r.waitHost(t, "committed", func(res, _, blocks int) bool { return res == 0 && blocks == n })
			if h := r.hits(t, n); h != n {
				t.Fatalf("%d of %d blocks visible after the event", h, n)
			}
			for i := range n {
				r.mustGet(t, i)
			}
			// Again: everything cached, nothing copied, done at once.
			op, err = r.s.PutFromDeviceBatch(context.Background(), r.hs, srcs, st)
			if err != nil || pending(op) || op.Stored() != 0 || op.Tier(0) != client.TierNone {
				t.Fatalf("put of cached blocks: %v (stored %d)", err, op.Stored())
			}
		}},
		{"put whose context ends before the event is aborted at the event", func(t *testing.T, r *devRig) {
			st := r.stream(t)
			release := hold(t, st)
			ctx, cancel := context.WithCancel(context.Background())
			op, err := r.s.PutFromDeviceAsync(ctx, r.hs[0], r.src(0), st)
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			// The copy may still write the slot: it stays reserved.
			r.waitHost(t, "reserved after cancel", func(res, _, _ int) bool { return res == 1 })
			if !pending(op) {
				t.Fatal("a canceled put finished before its copy")
			}
			release()
			<-op.Done()
			if err := op.Err(); !errors.Is(err, context.Canceled) || op.Stored() != 0 {
				t.Fatalf("canceled put: %v, stored %d", err, op.Stored())
			}
			r.waitHost(t, "aborted", func(res, _, blocks int) bool { return res == 0 && blocks == 0 })
			if h := r.hits(t, 1); h != 0 {
				t.Fatal("an aborted put is visible")
			}
		}},
		{"blocking put returns only after the commit", func(t *testing.T, r *devRig) {
			st := r.stream(t)
			release := hold(t, st)
			type result struct {
				stored bool
				err    error
			}
			ch := make(chan result, 1)
			go func() {
				stored, err := r.s.PutFromDevice(context.Background(), r.hs[1], r.src(1), st)
				ch <- result{stored, err}
			}()
			r.waitHost(t, "reserved", func(res, _, _ int) bool { return res == 1 })
			select {
			case res := <-ch:
				t.Fatalf("PutFromDevice returned (%v, %v) while its copy was held", res.stored, res.err)
			default:
			}
			release()
			if res := <-ch; !res.stored || res.err != nil {
				t.Fatalf("PutFromDevice: %v, %v", res.stored, res.err)
			}
			r.mustGet(t, 1)
		}},
		{"get releases its lease at the event", func(t *testing.T, r *devRig) {
			st := r.stream(t)
			for i := range 2 {
				if ok, err := r.s.PutFromDevice(context.Background(), r.hs[i], r.src(i), st); !ok || err != nil {
					t.Fatalf("put %d: %v %v", i, ok, err)
				}
			}
			release := hold(t, st)
			// Block 2 is not cached: a miss in a batch is TierNone.
			op, err := r.s.GetToDeviceBatch(context.Background(), r.hs[:3],
				[]cudaipc.DevicePtr{r.dst(0), r.dst(1), r.dst(2)}, st)
			if err != nil {
				t.Fatal(err)
			}
			if op.Tier(0) != client.TierHost || op.Tier(1) != client.TierHost || op.Tier(2) != client.TierNone {
				t.Fatalf("tiers %v %v %v", op.Tier(0), op.Tier(1), op.Tier(2))
			}
			r.waitHost(t, "leased while held", func(_, leased, _ int) bool { return leased == 2 })
			if !pending(op) {
				t.Fatal("the get completed while its stream was held")
			}
			if got := r.readDev(t, r.dst(0)); bytes.Equal(got, r.payload(0)) {
				t.Fatal("the destination holds the block before its copy ran")
			}
			release()
			if err := op.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				if got := r.readDev(t, r.dst(i)); !bytes.Equal(got, r.payload(i)) {
					t.Fatalf("block %d: bytes differ on the device", i)
				}
			}
			r.waitHost(t, "released", func(_, leased, _ int) bool { return leased == 0 })
			if _, err := r.s.GetToDeviceAsync(context.Background(), r.hs[2], r.dst(2), st); !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("get of a missing block: %v, want ErrNotFound", err)
			}
		}},
		{"a copy that cannot be queued aborts the reservation", func(t *testing.T, r *devRig) {
			st := r.stream(t)
			var notDevice [64]byte
			bad := cudaipc.DevicePtr(uintptr(unsafe.Pointer(&notDevice)))
			if _, err := r.s.PutFromDeviceAsync(context.Background(), r.hs[0], bad, st); !errors.Is(err, cudaipc.ErrInvalidValue) {
				t.Fatalf("put from a host address: %v, want ErrInvalidValue", err)
			}
			r.waitHost(t, "aborted", func(res, _, blocks int) bool { return res == 0 && blocks == 0 })
		}},
		{"close waits for the copies in flight", func(t *testing.T, r *devRig) {
			st := r.stream(t)
			release := hold(t, st)
			op, err := r.s.PutFromDeviceAsync(context.Background(), r.hs[0], r.src(0), st)
			if err != nil {
				t.Fatal(err)
			}
			closed := make(chan struct{})
			go func() {
				r.s.Close()
				close(closed)
			}()
			if _, err := r.s.PutFromDeviceAsync(context.Background(), r.hs[1], r.src(1), st); !errors.Is(err, client.ErrClosed) {
				// Close may not have started yet: then this op is in
				// flight too and Close waits for it as well.
				if err != nil {
					t.Fatal(err)
				}
			}
			r.waitHost(t, "reserved", func(res, _, _ int) bool { return res >= 1 })
			select {
			case <-closed:
				t.Fatal("Close returned while a copy was in flight")
			default:
			}
			release()
			<-closed
			if err := op.Err(); err != nil || op.Stored() != 1 {
				t.Fatalf("op in flight at Close: %v, stored %d", err, op.Stored())
			}
			s2, err := r.c.Open(context.Background(), testNS())
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			got := make([]byte, r.bs)
			if err := s2.Get(context.Background(), r.hs[0], got); err != nil || !bytes.Equal(got, r.payload(0)) {
				t.Fatalf("block committed at Close: %v", err)
			}
			r.waitHost(t, "nothing reserved", func(res, _, _ int) bool { return res == 0 })
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newDevRig(t, n))
		})
	}
}
