package itest

// The asynchronous device API against a daemon process with a GPU arena:
// puts and gets queued on held streams (cudaipc.HoldStream, the emulated
// device) return at once with their slots reserved or leased; the daemon sees
// the commit only after the stream ran; and a client killed with copies in
// flight leaves nothing reserved or leased behind.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
)

// gpuHoldRole (gpuclient op "hold") runs three phases on held streams,
// printing a line after queuing each and waiting for SIGUSR1 to release
// the stream: a batch put ("HELD put", then "PUT n"), a batch get of the
// same blocks ("HELD get", then "GOT gpu=.. host=.." after checking every
// byte), then, after one more SIGUSR1, a put of other blocks and a get,
// both held ("HELD both"), after which it waits to be killed.
func gpuHoldRole(ctx context.Context, s *client.Session, dev cudaipc.Device, seed uint64, hs []client.Hash, bs int) int {
	fail := func(format string, args ...any) int {
		fmt.Printf("FAIL "+format+"\n", args...)
		return 1
	}
	n := len(hs)
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	buf, err := dev.Alloc(int64(2 * n * bs)) // sources [0,n), destinations [n,2n)
	if err != nil {
		return fail("alloc: %v", err)
	}
	at := func(i int) cudaipc.DevicePtr { return buf.Ptr() + cudaipc.DevicePtr(i*bs) }
	src, dst := ptrs(at, 0, n), ptrs(at, n, 2*n)
	streams := make([]cudaipc.Stream, 3)
	for i := range streams {
		if streams[i], err = dev.NewStream(); err != nil {
			return fail("stream: %v", err)
		}
	}
	host := make([]byte, n*bs)
	for i, h := range hs {
		fillPayload(host[i*bs:(i+1)*bs], h)
	}
	if err := dev.CopyHtoDAsync(buf.Ptr(), host, streams[0]); err != nil {
		return fail("h2d: %v", err)
	}
	if err := streams[0].Synchronize(); err != nil {
		return fail("sync: %v", err)
	}
	held := func(op *client.DeviceOp) bool {
		select {
		case <-op.Done():
			return false
		default:
			return true
		}
	}

	release, err := cudaipc.HoldStream(streams[0])
	if err != nil {
		return fail("hold: %v", err)
	}
	op, err := s.PutFromDeviceBatch(ctx, hs, src, streams[0])
	if err != nil {
		return fail("put: %v", err)
	}
	if !held(op) {
		return fail("put completed on a held stream")
	}
	fmt.Println("HELD put")
	<-usr1
	release()
	if err := op.Wait(ctx); err != nil {
		return fail("put: %v", err)
	}
	fmt.Printf("PUT %d\n", op.Stored())

	if release, err = cudaipc.HoldStream(streams[0]); err != nil {
		return fail("hold: %v", err)
	}
	op, err = s.GetToDeviceBatch(ctx, hs, dst, streams[0])
	if err != nil {
		return fail("get: %v", err)
	}
	if !held(op) {
		return fail("get completed on a held stream")
	}
	fmt.Println("HELD get")
	<-usr1
	release()
	if err := op.Wait(ctx); err != nil {
		return fail("get: %v", err)
	}
	if err := dev.CopyDtoHAsync(host, at(n), streams[0]); err != nil {
		return fail("d2h: %v", err)
	}
	if err := streams[0].Synchronize(); err != nil {
		return fail("sync: %v", err)
	}
	tiers := map[string]int{}
	for i, h := range hs {
		if !bytes.Equal(host[i*bs:(i+1)*bs], payload(h, bs)) {
			return fail("block %d: bytes differ", i)
		}
		tiers[op.Tier(i).String()]++
	}
	fmt.Printf("GOT gpu=%d host=%d\n", tiers["gpu"], tiers["host"])
	<-usr1 // the parent saw the leases released

	// Copies in flight when the process dies: a put of other blocks and a
	// get, each on a held stream.
	if _, err := cudaipc.HoldStream(streams[1]); err != nil {
		return fail("hold: %v", err)
	}
	if _, err := cudaipc.HoldStream(streams[2]); err != nil {
		return fail("hold: %v", err)
	}
	if _, err := s.PutFromDeviceBatch(ctx, chain(seed+100, n), src, streams[1]); err != nil {
		return fail("put: %v", err)
	}
	if _, err := s.GetToDeviceBatch(ctx, hs, dst, streams[2]); err != nil {
		return fail("get: %v", err)
	}
	fmt.Println("HELD both")
	select {} // until killed
}

func TestGPUAsyncHold(t *testing.T) {
	if !cudaipc.Emulated {
		t.Skip("HoldStream needs the emulated device")
	}
	const n, bs, seed = 4, 256 << 10, 11
	dir := tmpDir(t)
	emu := map[string]string{cudaipc.EnvEmulatedGPUs: "1:64MiB"}
	denv := map[string]string{envDir: dir, envGPUArena: "8MiB", envCapacity: "64MiB"}
	for k, v := range emu {
		denv[k] = v
	}
	d := startProc(t, "daemon", "daemon", denv, "READY")
	defer d.kill()
	c := dial(t, socketOf(dir))
	s := open(t, c, testNS("itest", bs))
	hs, other := chain(seed, n), chain(seed+100, n)
	env := map[string]string{envSocket: socketOf(dir), envGPU: "0", envOp: "hold",
		envSeed: strconv.Itoa(seed), envN: strconv.Itoa(n), envBlock: strconv.Itoa(bs)}
	for k, v := range emu {
		env[k] = v
	}
	p := startProc(t, "hold", "gpuclient", env, "")
	row := func(st *client.Stats, name string) shm.TierStats {
		for _, tr := range st.Tiers {
			if tr.Name == name {
				return tr
			}
		}
		t.Fatalf("no %s row: %+v", name, st.Tiers)
		return shm.TierStats{}
	}
	hits := func(hs []client.Hash) int {
		res, err := s.Lookup(context.Background(), hs)
		if err != nil {
			t.Fatal(err)
		}
		return res.Hits
	}
	// wait polls the daemon's status until cond holds for gpu0 and host.
	wait := func(what string, cond func(gpu, host shm.TierStats, st *client.Stats) bool) {
		t.Helper()
		st, _, ok := waitStats(t, c, 10*time.Second, func(st *client.Stats) bool {
			return cond(row(st, "gpu0"), row(st, "host"), st)
		})
		if !ok {
			t.Fatalf("%s: gpu0 %+v host %+v sessions %d", what, row(st, "gpu0"), row(st, "host"), st.Sessions)
		}
	}
	resume := func() {
		if err := p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
	}

	// 1. A put on a held stream: reserved in the GPU arena, not visible.
	p.expect("HELD put", 30*time.Second)
	wait("put held", func(g, _ shm.TierStats, _ *client.Stats) bool { return g.Reserved == n && g.Blocks == 0 })
	if h := hits(hs); h != 0 {
		t.Fatalf("%d blocks visible before their copies ran", h)
	}
	resume()
	if l := p.expect("PUT", 30*time.Second); l != fmt.Sprintf("PUT %d", n) {
		t.Fatalf("put: %q", l)
	}
	// The op completes after the daemon answered the commit.
	if g := row(stats(t, c), "gpu0"); g.Reserved != 0 || g.Blocks != n {
		t.Fatalf("after the put: gpu0 %+v", g)
	}
	if h := hits(hs); h != n {
		t.Fatalf("%d of %d blocks visible after the event", h, n)
	}

	// 2. A get on a held stream: leased until the stream ran.
	p.expect("HELD get", 30*time.Second)
	wait("get held", func(g, _ shm.TierStats, _ *client.Stats) bool { return g.Leased == n })
	resume()
	if g, h := gpuGot(t, p.expect("GOT", 30*time.Second)); g != n || h != 0 {
		t.Fatalf("get: gpu=%d host=%d, want all %d from the GPU arena", g, h, n)
	}
	wait("get released", func(g, _ shm.TierStats, _ *client.Stats) bool { return g.Leased == 0 })
	resume()

	// 3. Killed with a put and a get in flight: the daemon's session
	// cleanup aborts the reservations and drops the leases.
	p.expect("HELD both", 30*time.Second)
	wait("both held", func(g, _ shm.TierStats, _ *client.Stats) bool { return g.Reserved == n && g.Leased == n })
	p.kill()
	wait("dead client's slots freed", func(g, h shm.TierStats, st *client.Stats) bool {
		return g.Reserved == 0 && g.Leased == 0 && g.Blocks == n && h.Reserved == 0 && h.Leased == 0 && st.Sessions == 1
	})
	if got := hits(other); got != 0 {
		t.Fatalf("%d blocks of the killed put are visible", got)
	}
	if got := hits(hs); got != n {
		t.Fatalf("%d of %d committed blocks left", got, n)
	}
	buf := make([]byte, bs)
	for i, h := range hs {
		if err := s.Get(context.Background(), h, buf); err != nil || !bytes.Equal(buf, payload(h, bs)) {
			t.Fatalf("block %d after the kill: %v", i, err)
		}
	}
}
