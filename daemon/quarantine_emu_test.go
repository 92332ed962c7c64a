//go:build linux && !cuda

package daemon

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cudaipc"
)

const (
	quarantineHelperEnv = "KVTIER_TEST_QUARANTINE_CLIENT" // socket path
	quarantineBlock     = 256 << 10
	quarantineBlocksB   = 8 // blocks session B puts
)

// TestQuarantineHelperClient is not a test: it is the client process of
// TestLateDeviceCopyCannotReachAnotherSession (the test binary re-run). Each
// step waits for a line on stdin and answers with one on stdout:
//
//	HELD  session A's put of one block is reserved, its copy held on its stream
//	PUT   session B (a new client) has put and committed its blocks from the device
//	OK    A's copy ran, and B read back exactly its own bytes (else FAIL ...)
func TestQuarantineHelperClient(t *testing.T) {
	sock := os.Getenv(quarantineHelperEnv)
	if sock == "" {
		t.Skip("helper process of TestLateDeviceCopyCannotReachAnotherSession")
	}
	in := bufio.NewReader(os.Stdin)
	step := func(format string, args ...any) {
		fmt.Printf(format+"\n", args...)
		if _, err := in.ReadString('\n'); err != nil {
			os.Exit(0) // the test is done with us
		}
	}
	fail := func(format string, args ...any) {
		step("FAIL "+format, args...)
		os.Exit(1)
	}
	ctx := context.Background()
	devs, err := cudaipc.Devices()
	if err != nil {
		fail("devices: %v", err)
	}
	dev := devs[0]
	open := func(name string) *client.Session {
		c, err := client.Dial(ctx, client.Options{Socket: sock, Name: name, Device: dev})
		if err != nil {
			fail("dial: %v", err)
		}
		s, err := c.Open(ctx, testNamespace(quarantineBlock))
		if err != nil {
			fail("open: %v", err)
		}
		return s
	}
	const bs = quarantineBlock
	buf, err := dev.Alloc(int64((1 + 2*quarantineBlocksB) * bs)) // A's source, B's sources, B's destinations
	if err != nil {
		fail("alloc: %v", err)
	}
	at := func(i int) cudaipc.DevicePtr { return buf.Ptr() + cudaipc.DevicePtr(i*bs) }
	hA, hB := testBlocks(1, 1)[0], testBlocks(2, quarantineBlocksB)
	host := block(hA, bs)
	for _, h := range hB {
		host = append(host, block(h, bs)...)
	}
	sync, err := dev.NewStream()
	if err != nil {
		fail("stream: %v", err)
	}
	if err := dev.CopyHtoDAsync(buf.Ptr(), host, sync); err != nil {
		fail("h2d: %v", err)
	}
	if err := sync.Synchronize(); err != nil {
		fail("sync: %v", err)
	}

	sa := open("a")
	held, err := dev.NewStream()
	if err != nil {
		fail("stream: %v", err)
	}
	release, err := cudaipc.HoldStream(held)
	if err != nil {
		fail("hold: %v", err)
	}
	opA, err := sa.PutFromDeviceAsync(ctx, hA, at(0), held)
	if err != nil {
		fail("A's put: %v", err)
	}
	if opA.Tier(0) != client.TierGPU {
		fail("A's put went to %v, want a GPU slot", opA.Tier(0))
	}
	step("HELD")

	sb := open("b")
	srcs, dsts := make([]cudaipc.DevicePtr, quarantineBlocksB), make([]cudaipc.DevicePtr, quarantineBlocksB)
	for i := range srcs {
		srcs[i], dsts[i] = at(1+i), at(1+quarantineBlocksB+i)
	}
	opB, err := sb.PutFromDeviceBatch(ctx, hB, srcs, sync)
	if err == nil {
		err = opB.Wait(ctx)
	}
	if err != nil || opB.Stored() != quarantineBlocksB {
		fail("B's put: %v", err)
	}
	step("PUT")

	release() // A's copy runs now, into the slot A reserved
	opA.Wait(ctx)
	got, err := sb.GetToDeviceBatch(ctx, hB, dsts, sync)
	if err == nil {
		err = got.Wait(ctx)
	}
	if err != nil {
		fail("B's get: %v", err)
	}
	back := make([]byte, quarantineBlocksB*bs)
	if err := dev.CopyDtoHAsync(back, at(1+quarantineBlocksB), sync); err != nil {
		fail("d2h: %v", err)
	}
	if err := sync.Synchronize(); err != nil {
		fail("sync: %v", err)
	}
	for i, h := range hB {
		b := back[i*bs : (i+1)*bs]
		switch {
		case bytes.Equal(b, block(hA, bs)):
			fail("B's block %d (from %v) holds A's bytes: A's late copy overwrote it", i, got.Tier(i))
		case !bytes.Equal(b, block(h, bs)):
			fail("B's block %d (from %v) differs", i, got.Tier(i))
		}
	}
	step("OK")
	select {} // until killed
}

// TestLateDeviceCopyCannotReachAnotherSession: a device client's put is a
// copy queued on its stream into the reserved slot, committed after the
// copy's event. When the client's process dies, the exit tracer stops its
// session before the kernel closes the process's driver files, and the
// copy may still run until then. The daemon must not hand that slot to
// anyone before the process is gone. Here the helper's session A is
// stopped as by an exit event while A's copy is held on its stream
// (HoldStream) and the process lives on; a second session B of the same
// process puts and commits its blocks on the GPU; then A's copy runs. B
// must read back its own bytes, and A's slot must come back once the
// process has exited, long before the hold.
func TestLateDeviceCopyCannotReachAnotherSession(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // after the daemon's cleanup
	if !cudaipc.Emulated {
		t.Skip("needs the emulated GPU build (HoldStream)")
	}
	t.Setenv(cudaipc.EnvEmulatedGPUs, "1:64MiB")
	md := startMetricsDaemon(t, false)
	if md.d.gpus == nil {
		t.Fatal("GPU tier off with an emulated GPU")
	}
	md.d.quar.hold.Store(int64(time.Minute)) // only the exit may end it here
	gpuReserved := func() int { return md.d.gpus.Stats().Devices[0].Reserved }

	cmd := exec.Command(os.Args[0], "-test.run=^TestQuarantineHelperClient$", "-test.v=false")
	cmd.Env = append(os.Environ(), quarantineHelperEnv+"="+md.cfg.Socket)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := bufio.NewReader(stdout)
	expect := func(want string) {
		t.Helper()
		line, err := lines.ReadString('\n')
		if line = strings.TrimSpace(line); line != want {
			t.Fatalf("helper said %q (%v), want %q", line, err, want)
		}
	}
	next := func() { io.WriteString(stdin, "go\n") }

	expect("HELD")
	if r := gpuReserved(); r != 1 {
		t.Fatalf("%d GPU reservations with A's put held, want 1", r)
	}
	// The exit tracer's event for the helper: A stops, its copy queued.
	if n := md.d.clientExited(uint32(cmd.Process.Pid), 0); n != 1 {
		t.Fatalf("exit event stopped %d sessions, want 1", n)
	}
	waitFor(t, "A's session to end", func() bool {
		md.d.mu.Lock()
		defer md.d.mu.Unlock()
		return len(md.d.sessions) == 0
	})
	if q, r := md.d.quar.blocks.Load(), gpuReserved(); q != 1 || r != 1 {
		t.Fatalf("after A ended with a put open: %d quarantined, %d GPU reservations; want 1 and 1", q, r)
	}
	next()
	expect("PUT")
	next()
	expect("OK")

	t0 := time.Now()
	cmd.Process.Kill()
	cmd.Wait()
	exited = true
	waitFor(t, "A's slot to leave the quarantine after its process exited", func() bool {
		return md.d.quar.blocks.Load() == 0 && gpuReserved() == 0
	})
	if el := time.Since(t0); el > 10*time.Second {
		t.Errorf("slot released %v after the exit", el)
	}
	if v := scrape(t, md.d.MetricsAddr()).must(t, "kvtier_quarantined_reservations_total"); v != 1 {
		t.Errorf("scraped kvtier_quarantined_reservations_total = %v, want 1", v)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for dl := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(dl) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
