package itest

// GPU tier tests with the emulated device: a daemon process and client
// processes on (emulated) GPUs exchange blocks through the daemon's GPU
// arenas opened by IPC (same-process IPC open fails by design, so every
// party is its own process). Every byte is verified.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/daemon"
	"github.com/kvtier/kvtier/shm"
)

// gpuHigh is the daemon's gpu.high_watermark in these tests.
const gpuHigh = 0.9

const (
	envGPUArena = "KVTIER_ITEST_GPU_ARENA" // daemon: GPU arena bytes per GPU
	envGPU      = "KVTIER_ITEST_GPU"       // gpuclient: GPU ordinal ("" = no GPU, host API)
)

// configureGPU sizes the daemon's GPU tier for the tests (no-op unless
// envGPUArena is set; without KVTIER_EMULATED_GPUS no GPU is found anyway).
func configureGPU(cfg *daemon.Config) {
	if v := os.Getenv(envGPUArena); v != "" {
		cfg.GPU.ArenaBytes.Set(v)
		cfg.GPU.SlabBytes = 1 << 20
		cfg.GPU.HighWatermark, cfg.GPU.LowWatermark = gpuHigh, 0.8
	}
}

// gpuClientRole puts (op put) or gets and verifies (op get) a chain of
// blocks through the device API, and prints per-tier counts.
func gpuClientRole() int {
	fail := func(format string, args ...any) int {
		fmt.Printf("FAIL "+format+"\n", args...)
		return 1
	}
	ctx := context.Background()
	n, _ := strconv.Atoi(os.Getenv(envN))
	bs, _ := strconv.Atoi(os.Getenv(envBlock))
	seed, _ := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	gpu := os.Getenv(envGPU)
	c, err := client.Dial(ctx, client.Options{Socket: os.Getenv(envSocket), Name: "itest-gpu", GPU: gpu})
	if err != nil {
		return fail("dial: %v", err)
	}
	defer c.Close()
	s, err := c.Open(ctx, testNS("itest", bs))
	if err != nil {
		return fail("open: %v", err)
	}
	defer s.Close()
	hs := chain(seed, n)
	if gpu == "" { // host API: GPU-resident blocks are copied down for us
		buf := make([]byte, bs)
		for i, h := range hs {
			if err := s.Get(ctx, h, buf); err != nil {
				return fail("get %d: %v", i, err)
			}
			if !bytes.Equal(buf, payload(h, bs)) {
				return fail("block %d: bytes differ", i)
			}
		}
		fmt.Printf("GOT %d\n", n)
		return 0
	}
	devs, err := cudaipc.Devices()
	if err != nil {
		return fail("devices: %v", err)
	}
	ord, _ := strconv.Atoi(gpu)
	dev := devs[ord]
	buf, err := dev.Alloc(int64(n * bs))
	if err != nil {
		return fail("alloc: %v", err)
	}
	defer buf.Free()
	st, err := dev.NewStream()
	if err != nil {
		return fail("stream: %v", err)
	}
	defer st.Close()
	at := func(i int) cudaipc.DevicePtr { return buf.Ptr() + cudaipc.DevicePtr(i*bs) }
	host := make([]byte, n*bs)
	switch op := os.Getenv(envOp); op {
	case "put":
		for i, h := range hs {
			fillPayload(host[i*bs:(i+1)*bs], h)
		}
		if err := dev.CopyHtoDAsync(buf.Ptr(), host, st); err != nil {
			return fail("h2d: %v", err)
		}
		// Pipelined as an engine would: batches queued behind each other
		// on the stream, each committed at its own event, waited for at
		// the end; the first block through the blocking call.
		ok, err := s.PutFromDevice(ctx, hs[0], at(0), st)
		if err != nil {
			return fail("put 0: %v", err)
		}
		stored := 0
		if ok {
			stored++
		}
		ops, err := gpuBatches(n, 1, func(lo, hi int) (*client.DeviceOp, error) {
			return s.PutFromDeviceBatch(ctx, hs[lo:hi], ptrs(at, lo, hi), st)
		})
		if err != nil {
			return fail("put: %v", err)
		}
		for _, op := range ops {
			if err := op.Wait(ctx); err != nil {
				return fail("put: %v", err)
			}
			stored += op.Stored()
		}
		fmt.Printf("PUT %d\n", stored)
	case "get":
		tiers := map[string]int{}
		ops, err := gpuBatches(n, 0, func(lo, hi int) (*client.DeviceOp, error) {
			return s.GetToDeviceBatch(ctx, hs[lo:hi], ptrs(at, lo, hi), st)
		})
		if err != nil {
			return fail("get: %v", err)
		}
		// Queued behind the gets on the same stream: sees their bytes.
		if err := dev.CopyDtoHAsync(host, buf.Ptr(), st); err != nil {
			return fail("d2h: %v", err)
		}
		if err := st.Synchronize(); err != nil {
			return fail("sync: %v", err)
		}
		for _, op := range ops {
			if err := op.Wait(ctx); err != nil {
				return fail("get: %v", err)
			}
			for i := range op.Len() {
				if op.Tier(i) == client.TierNone {
					return fail("get: a cached block missed")
				}
				tiers[op.Tier(i).String()]++
			}
		}
		for i, h := range hs {
			if !bytes.Equal(host[i*bs:(i+1)*bs], payload(h, bs)) {
				return fail("block %d: bytes differ", i)
			}
		}
		fmt.Printf("GOT gpu=%d host=%d\n", tiers["gpu"], tiers["host"])
	case "hold":
		return gpuHoldRole(ctx, s, dev, seed, hs, bs)
	case "closelease":
		// Close the client (which opened its GPU) with a lease still
		// open, then release the lease: the last user of the mappings
		// unpins the host arena and unmaps the GPU arena, on a device
		// that must still be open for it.
		blk := make([]byte, bs)
		fillPayload(blk, hs[0])
		if _, err := s.Put(ctx, hs[0], blk); err != nil {
			return fail("put: %v", err)
		}
		l, err := s.Acquire(ctx, hs[0])
		if err != nil {
			return fail("acquire: %v", err)
		}
		b := l.Bytes()
		c.Close()
		l.Release() // the session is gone: only the mappings' reference matters
		if err := dev.RegisterHost(b); err != nil {
			return fail("host arena still registered after its last user let go: %v", err)
		}
		dev.UnregisterHost(b)
		fmt.Println("CLOSED")
	default:
		return fail("unknown op %q", op)
	}
	return 0
}

// gpuBatch is how many blocks one device call carries in the gpuclient role.
const gpuBatch = 16

// gpuBatches issues call for [from, n) in batches of gpuBatch and returns the
// ops in flight.
func gpuBatches(n, from int, call func(lo, hi int) (*client.DeviceOp, error)) ([]*client.DeviceOp, error) {
	var ops []*client.DeviceOp
	for lo := from; lo < n; lo += gpuBatch {
		hi := min(lo+gpuBatch, n)
		op, err := call(lo, hi)
		if err != nil {
			return nil, fmt.Errorf("blocks [%d,%d): %w", lo, hi, err)
		}
		ops = append(ops, op)
	}
	return ops, nil
}

func ptrs(at func(int) cudaipc.DevicePtr, lo, hi int) []cudaipc.DevicePtr {
	ps := make([]cudaipc.DevicePtr, 0, hi-lo)
	for i := lo; i < hi; i++ {
		ps = append(ps, at(i))
	}
	return ps
}

func gpuGot(t *testing.T, line string) (gpu, host int) {
	t.Helper()
	if _, err := fmt.Sscanf(strings.TrimSpace(line), "GOT gpu=%d host=%d", &gpu, &host); err != nil {
		t.Fatalf("parse %q: %v", line, err)
	}
	return gpu, host
}

func TestGPUTier(t *testing.T) {
	// On real GPUs (scripts/gpu-check.sh, KVTIER_ITEST_REAL_GPU=1) the
	// migration step needs two of them.
	real := !cudaipc.Emulated
	if real && os.Getenv("KVTIER_ITEST_REAL_GPU") != "1" {
		t.Skip("cuda build: run through scripts/gpu-check.sh on a GPU host")
	}
	ngpu := 2
	if real {
		devs, err := cudaipc.Devices()
		if err != nil {
			t.Fatal(err)
		}
		ngpu = len(devs)
		for _, d := range devs {
			d.Close()
		}
	}
	dir := tmpDir(t)
	emu := map[string]string{cudaipc.EnvEmulatedGPUs: "2:64MiB"}
	if real {
		emu = map[string]string{}
	}
	denv := map[string]string{envDir: dir, envGPUArena: "8MiB", envCapacity: "64MiB"}
	for k, v := range emu {
		denv[k] = v
	}
	d := startProc(t, "daemon", "daemon", denv, "READY")
	defer d.kill()
	const bs = 256 << 10
	run := func(name, gpu, op string, seed uint64, n int, want string) string {
		env := map[string]string{envSocket: socketOf(dir), envGPU: gpu, envOp: op,
			envSeed: strconv.FormatUint(seed, 10), envN: strconv.Itoa(n), envBlock: strconv.Itoa(bs)}
		for k, v := range emu {
			env[k] = v
		}
		p := startProc(t, name, "gpuclient", env, "")
		line := p.expect(want, 60*time.Second)
		if err := p.wait(30 * time.Second); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return line
	}

	// 1. Exchange through GPU 0's arena: 16 blocks (4MiB of the 8MiB arena).
	if l := run("put0", "0", "put", 1, 16, "PUT"); l != "PUT 16" {
		t.Fatalf("put: %q", l)
	}
	if g, h := gpuGot(t, run("get0", "0", "get", 1, 16, "GOT")); g != 16 || h != 0 {
		t.Fatalf("same-GPU get: gpu=%d host=%d, want all 16 from the GPU arena", g, h)
	}
	// 2. Migration: a client on GPU 1 gets them by peer copy into GPU 1's arena.
	if ngpu < 2 {
		t.Log("one GPU: migration step skipped")
	} else if g, h := gpuGot(t, run("get1", "1", "get", 1, 16, "GOT")); g != 16 || h != 0 {
		t.Fatalf("migration: gpu=%d host=%d, want all 16 migrated into GPU 1's arena", g, h)
	}
	// A host-only client reads GPU-resident blocks (copied down for it).
	run("gethost", "", "get", 1, 16, "GOT 16")

	// 3. Pressure: 96 more blocks (24MiB) through GPU 0's 8MiB arena: the
	// overflow goes to the host tier and the demoter moves cold blocks down.
	if l := run("put0b", "0", "put", 2, 96, "PUT"); l != "PUT 96" {
		t.Fatalf("put under pressure: %q", l)
	}
	c, err := client.Dial(context.Background(), client.Options{Socket: socketOf(dir), Name: "itest-stats"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gpu0 := func(st *client.Stats) shm.TierStats {
		for _, tr := range st.Tiers {
			if tr.Name == "gpu0" {
				return tr
			}
		}
		t.Fatalf("no gpu0 row: %+v", st.Tiers)
		return shm.TierStats{}
	}
	g, h := gpuGot(t, run("get0b", "0", "get", 2, 96, "GOT"))
	st := stats(t, c)
	// Every read is accounted for (and every byte was checked). How many
	// came from the host tier depends on how fast the demoter makes room
	// (host blocks are promoted when there is): no count is promised.
	if g+h != 96 || gpu0(st).Demotions == 0 {
		t.Fatalf("under pressure: gpu=%d host=%d, demotions %d", g, h, gpu0(st).Demotions)
	}
	// Host → GPU promotion: a GPU client's hits on host blocks promote them
	// into its arena when it has room; with the arena full they are served
	// from the host tier and kick the demoter, so a later read promotes.
	g2, h2 := gpuGot(t, run("get0c", "0", "get", 2, 8, "GOT"))
	if g2 == 0 {
		st := stats(t, c)
		if gpu0(st).PromotionFallbacks == 0 {
			t.Fatalf("all 8 reads served from the host tier, and no promotion fallback was counted: %+v", gpu0(st))
		}
		// Each fallback kicked the demoter down to the low watermark:
		// wait for the room it makes (a condition, not a delay).
		if st, _, ok := waitStats(t, c, 10*time.Second, func(st *client.Stats) bool {
			r := gpu0(st)
			return float64(r.UsedBytes+bs) <= gpuHigh*float64(r.CapacityBytes)
		}); !ok {
			t.Fatalf("the demoter made no room after promotion fallbacks: %+v", gpu0(st))
		}
		g2, h2 = gpuGot(t, run("get0d", "0", "get", 2, 8, "GOT"))
		if g2 == 0 {
			t.Fatalf("no promotion host → GPU with room on the GPU: gpu=%d host=%d", g2, h2)
		}
	}
	// The clients' sessions end (their releases, or the daemon's cleanup)
	// after they exited.
	st, _, ok := waitStats(t, c, 10*time.Second, func(st *client.Stats) bool {
		r := gpu0(st)
		return r.Leased == 0 && r.Reserved == 0
	})
	if !ok {
		t.Fatalf("gpu0 after the clients left: %+v", gpu0(st))
	}
	t.Logf("pressure pass: gpu=%d host=%d; promotion pass: gpu=%d host=%d; fallbacks %d", g, h, g2, h2, gpu0(st).PromotionFallbacks)
}

// TestGPUExchange10k is the figure on the emulated device: a client
// process on GPU 0 puts 10,000 blocks of 16 KiB from device memory into the
// daemon's GPU arena, a second process on the same GPU gets them back into
// device memory, and every byte is verified. The daemon's status then shows
// the GPU tier's rows.
func TestGPUExchange10k(t *testing.T) {
	if !cudaipc.Emulated {
		t.Skip("cuda build: run through scripts/gpu-check.sh on a GPU host")
	}
	const (
		n  = 10000
		bs = 16 << 10
	)
	dir := tmpDir(t)
	emu := map[string]string{cudaipc.EnvEmulatedGPUs: "1:512MiB"}
	denv := map[string]string{envDir: dir, envGPUArena: "256MiB", envCapacity: "64MiB"}
	for k, v := range emu {
		denv[k] = v
	}
	d := startProc(t, "daemon", "daemon", denv, "READY")
	defer d.kill()
	run := func(name, op, want string) string {
		env := map[string]string{envSocket: socketOf(dir), envGPU: "0", envOp: op,
			envSeed: "7", envN: strconv.Itoa(n), envBlock: strconv.Itoa(bs)}
		for k, v := range emu {
			env[k] = v
		}
		p := startProc(t, name, "gpuclient", env, "")
		line := p.expect(want, 60*time.Second)
		if err := p.wait(30 * time.Second); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return line
	}
	t0 := time.Now()
	if l := run("put", "put", "PUT"); l != fmt.Sprintf("PUT %d", n) {
		t.Fatalf("put: %q", l)
	}
	g, h := gpuGot(t, run("get", "get", "GOT")) // "GOT" only after every byte matched
	if g != n || h != 0 {
		t.Fatalf("get: gpu=%d host=%d, want all %d from the GPU arena", g, h, n)
	}
	t.Logf("%d blocks of %d KiB exchanged through the GPU tier in %v, zero byte errors", n, bs>>10, time.Since(t0))

	c, err := client.Dial(context.Background(), client.Options{Socket: socketOf(dir), Name: "itest-stats"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := stats(t, c)
	var gpu0 bool
	for _, tr := range st.Tiers {
		if tr.Name == "gpu0" {
			gpu0 = true
			if tr.Blocks != n || tr.UsedBytes != n*bs || tr.Hits != n || tr.CapacityBytes != 256<<20 {
				t.Fatalf("gpu0 row: %+v", tr)
			}
		}
	}
	if !gpu0 || st.Tiers[0].Name != "host" {
		t.Fatalf("tiers: %+v", st.Tiers)
	}
	moves := map[string]bool{}
	for _, m := range st.Moves {
		moves[m.From+"→"+m.To] = true
	}
	for _, want := range []string{"gpu→host", "host→gpu", "gpu→gpu"} {
		if !moves[want] {
			t.Fatalf("no %s move row: %+v", want, st.Moves)
		}
	}
}

// TestGPUClientClosedWithLease: a client that opened its GPU itself
// (Options.GPU) and is closed while a lease is still open keeps the device
// open until that lease is released, so that the last user of the session's
// mappings can unregister the pinned host arena and unmap the GPU arena
// (with CUDA both need the device's context: on a closed device they fail,
// and the registration and the mapping leak for the process's life).
func TestGPUClientClosedWithLease(t *testing.T) {
	if !cudaipc.Emulated {
		t.Skip("cuda build: run through scripts/gpu-check.sh on a GPU host")
	}
	dir := tmpDir(t)
	emu := map[string]string{cudaipc.EnvEmulatedGPUs: "1:64MiB"}
	d := startProc(t, "daemon", "daemon", map[string]string{envDir: dir, envGPUArena: "8MiB", envCapacity: "64MiB",
		cudaipc.EnvEmulatedGPUs: emu[cudaipc.EnvEmulatedGPUs]}, "READY")
	defer d.kill()
	env := map[string]string{envSocket: socketOf(dir), envGPU: "0", envOp: "closelease",
		envSeed: "5", envN: "1", envBlock: strconv.Itoa(256 << 10)}
	for k, v := range emu {
		env[k] = v
	}
	p := startProc(t, "closelease", "gpuclient", env, "")
	if l := p.expect("CLOSED", 60*time.Second); l != "CLOSED" {
		t.Fatalf("client: %q", l)
	}
	if err := p.wait(30 * time.Second); err != nil {
		t.Fatalf("client: %v", err)
	}
}
