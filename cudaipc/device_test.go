package cudaipc_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/cudaipc"
)

// The conformance suite: every test runs against whatever Devices returns, the
// emulated GPUs by default and the real ones with -tags cuda on a GPU host.
// Behaviour only the emulation can promise (bounds checks, exact free-memory
// accounting) is gated on cudaipc.Emulated.

func devices(t *testing.T, min int) []cudaipc.Device {
	t.Helper()
	devs, err := cudaipc.Devices()
	if errors.Is(err, cudaipc.ErrNoDevice) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range devs {
			if err := d.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	if len(devs) < min {
		t.Skipf("%d devices, need %d", len(devs), min)
	}
	return devs
}

func alloc(t *testing.T, d cudaipc.Device, size int64) cudaipc.Arena {
	t.Helper()
	a, err := d.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Free() })
	return a
}

func stream(t *testing.T, d cudaipc.Device) cudaipc.Stream {
	t.Helper()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// readBack copies n bytes at p to the host and waits for them.
func readBack(t *testing.T, d cudaipc.Device, p cudaipc.DevicePtr, n int) []byte {
	t.Helper()
	s := stream(t, d)
	b := make([]byte, n)
	if err := d.CopyDtoHAsync(b, p, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t *testing.T, d cudaipc.Device, p cudaipc.DevicePtr, b []byte) {
	t.Helper()
	s := stream(t, d)
	if err := d.CopyHtoDAsync(p, b, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func TestEnumerate(t *testing.T) {
	devs := devices(t, 1)
	seen := map[cudaipc.UUID]bool{}
	for i, d := range devs {
		info := d.Info()
		if info.Ordinal != i {
			t.Errorf("device %d has ordinal %d", i, info.Ordinal)
		}
		if info.UUID == (cudaipc.UUID{}) || seen[info.UUID] {
			t.Errorf("device %d: zero or duplicate UUID %s", i, info.UUID)
		}
		seen[info.UUID] = true
		if !strings.HasPrefix(info.UUID.String(), "GPU-") || len(info.UUID.String()) != 40 {
			t.Errorf("UUID string %q", info.UUID)
		}
		free, total, err := d.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		if total != info.TotalMem || total <= 0 || free < 0 || free > total {
			t.Errorf("device %d: free %d total %d, Info.TotalMem %d", i, free, total, info.TotalMem)
		}
		t.Logf("%d %s %q total %d free %d", i, info.UUID, info.Name, total, free)
	}
	// UUIDs are stable across enumerations (and processes).
	again := devices(t, len(devs))
	for i := range devs {
		if again[i].Info().UUID != devs[i].Info().UUID {
			t.Errorf("device %d UUID changed between enumerations", i)
		}
	}
}

func TestEmulatedConfig(t *testing.T) {
	if !cudaipc.Emulated {
		t.Skip("real GPUs")
	}
	t.Setenv(cudaipc.EnvEmulatedGPUs, "")
	if _, err := cudaipc.Devices(); !errors.Is(err, cudaipc.ErrNoDevice) {
		t.Errorf("unset: %v, want ErrNoDevice", err)
	}
	t.Setenv(cudaipc.EnvEmulatedGPUs, "0")
	if _, err := cudaipc.Devices(); !errors.Is(err, cudaipc.ErrNoDevice) {
		t.Errorf("0: %v, want ErrNoDevice", err)
	}
	for _, bad := range []string{"x", "-1", "2:", "2:lots", "1000"} {
		t.Setenv(cudaipc.EnvEmulatedGPUs, bad)
		if _, err := cudaipc.Devices(); err == nil || errors.Is(err, cudaipc.ErrNoDevice) {
			t.Errorf("%q: %v, want a configuration error", bad, err)
		}
	}
	t.Setenv(cudaipc.EnvEmulatedGPUs, "3:1MiB")
	devs := devices(t, 3)
	if len(devs) != 3 || devs[2].Info().TotalMem != 1<<20 {
		t.Fatalf("3:1MiB gave %d devices of %d bytes", len(devs), devs[0].Info().TotalMem)
	}
}

func TestAllocFree(t *testing.T) {
	d := devices(t, 1)[0]
	free0, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.Alloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if a.Size() != 4<<20 || a.Ptr() == 0 {
		t.Fatalf("arena %#x+%d", a.Ptr(), a.Size())
	}
	free1, _, _ := d.MemInfo()
	if cudaipc.Emulated && free1 != free0-4<<20 {
		t.Errorf("free %d after allocating 4 MiB of %d", free1, free0)
	}
	if err := a.Free(); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(); !errors.Is(err, cudaipc.ErrClosed) {
		t.Errorf("second Free: %v, want ErrClosed", err)
	}
	if _, err := a.IPCHandle(); !errors.Is(err, cudaipc.ErrClosed) {
		t.Errorf("export of a freed arena: %v, want ErrClosed", err)
	}
	if free2, _, _ := d.MemInfo(); cudaipc.Emulated && free2 != free0 {
		t.Errorf("free %d after Free, want %d", free2, free0)
	}
	if _, err := d.Alloc(0); !errors.Is(err, cudaipc.ErrInvalidValue) {
		t.Errorf("Alloc(0): %v, want ErrInvalidValue", err)
	}
	if _, err := d.Alloc(d.Info().TotalMem + 1); !errors.Is(err, cudaipc.ErrOutOfMemory) {
		t.Errorf("Alloc(total+1): %v, want ErrOutOfMemory", err)
	}
}

// H2D → D2D → D2H through two arenas, completion tied to an event.
func TestRoundTrip(t *testing.T) {
	d := devices(t, 1)[0]
	const n = 3<<20 + 123
	a, b := alloc(t, d, 4<<20), alloc(t, d, 4<<20)
	s := stream(t, d)
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if done, err := ev.Query(); err != nil || !done {
		t.Errorf("unrecorded event: done %v, %v; want complete", done, err)
	}
	src := pattern(n, 7)
	dst := make([]byte, n)
	const off = 4096 + 17 // pointer arithmetic inside an arena
	if err := d.CopyHtoDAsync(a.Ptr()+off, src, s); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyDtoDAsync(b.Ptr(), a.Ptr()+off, n, s); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyDtoHAsync(dst, b.Ptr(), s); err != nil {
		t.Fatal(err)
	}
	if err := ev.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := ev.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); err != nil || !done {
		t.Errorf("after Synchronize: done %v, %v", done, err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("round trip changed the bytes")
	}
	// Zero-length copies are no-ops.
	if err := d.CopyDtoDAsync(b.Ptr(), a.Ptr(), 0, s); err != nil {
		t.Error(err)
	}
}

// Many streams copying concurrently, each checked by its own event; then the
// arena is freed with copies still queued (Free waits for them).
func TestConcurrentStreams(t *testing.T) {
	d := devices(t, 1)[0]
	const streams, blocks, bs = 4, 32, 64 << 10
	a := alloc(t, d, streams*blocks*bs)
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := d.NewStream()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			ev, err := d.NewEvent()
			if err != nil {
				errs <- err
				return
			}
			defer ev.Close()
			outs := make([][]byte, blocks)
			for j := range blocks {
				p := a.Ptr() + cudaipc.DevicePtr((i*blocks+j)*bs)
				outs[j] = make([]byte, bs)
				if err := d.CopyHtoDAsync(p, pattern(bs, byte(i*blocks+j)), s); err != nil {
					errs <- err
					return
				}
				if err := d.CopyDtoHAsync(outs[j], p, s); err != nil {
					errs <- err
					return
				}
			}
			if err := ev.Record(s); err != nil {
				errs <- err
				return
			}
			if err := ev.Synchronize(); err != nil {
				errs <- err
				return
			}
			for j := range blocks {
				if !bytes.Equal(outs[j], pattern(bs, byte(i*blocks+j))) {
					errs <- fmt.Errorf("stream %d block %d differs", i, j)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	b := alloc(t, d, 16<<20)
	s := stream(t, d)
	for range 64 {
		if err := d.CopyDtoDAsync(b.Ptr(), a.Ptr(), a.Size(), s); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Free(); err != nil { // waits for the queued copies
		t.Fatal(err)
	}
}

func TestEmulatedBounds(t *testing.T) {
	if !cudaipc.Emulated {
		t.Skip("real GPUs do not bounds-check copies")
	}
	devs := devices(t, 2)
	d := devs[0]
	a := alloc(t, d, 1<<20)
	s := stream(t, d)
	buf := make([]byte, 4096)
	for name, err := range map[string]error{
		"past end":    d.CopyHtoDAsync(a.Ptr()+1<<20-100, buf, s),
		"not device":  d.CopyDtoHAsync(buf, cudaipc.DevicePtr(0x1000), s),
		"other GPU":   devs[1].CopyHtoDAsync(a.Ptr(), buf, s),
		"negative":    d.CopyDtoDAsync(a.Ptr(), a.Ptr(), -1, s),
		"peer memory": d.CopyPeerAsync(a.Ptr(), devs[1], a.Ptr(), 16, s),
	} {
		if !errors.Is(err, cudaipc.ErrInvalidValue) {
			t.Errorf("%s: %v, want ErrInvalidValue", name, err)
		}
	}
}

func TestClosed(t *testing.T) {
	devs := devices(t, 1)
	d := devs[0]
	a := alloc(t, d, 1<<20)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, cudaipc.ErrClosed) {
		t.Errorf("second stream Close: %v", err)
	}
	if err := d.CopyHtoDAsync(a.Ptr(), make([]byte, 16), s); !errors.Is(err, cudaipc.ErrClosed) {
		t.Errorf("copy on a closed stream: %v, want ErrClosed", err)
	}
	if err := ev.Record(s); !errors.Is(err, cudaipc.ErrClosed) {
		t.Errorf("record on a closed stream: %v, want ErrClosed", err)
	}
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ev.Query(); !errors.Is(err, cudaipc.ErrClosed) {
		t.Errorf("query of a closed event: %v, want ErrClosed", err)
	}
	// A closed device handle refuses work.
	more, err := cudaipc.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := more[0].Alloc(1 << 20); !errors.Is(err, cudaipc.ErrClosed) {
		t.Errorf("Alloc on a closed device: %v, want ErrClosed", err)
	}
}

func TestHostRegister(t *testing.T) {
	d := devices(t, 1)[0]
	// Host arenas are mmap'd (not Go heap): register one like the daemon does.
	host, err := unix.Mmap(-1, 0, 2<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(host)
	if err := d.RegisterHost(host); err != nil {
		t.Fatal(err)
	}
	if err := d.RegisterHost(host[4096:8192]); err == nil {
		t.Error("registering an overlapping range succeeded")
	}
	a := alloc(t, d, 2<<20)
	copy(host, pattern(len(host), 9))
	write(t, d, a.Ptr(), host)
	if !bytes.Equal(readBack(t, d, a.Ptr(), len(host)), pattern(len(host), 9)) {
		t.Error("copy through registered memory changed the bytes")
	}
	if err := d.UnregisterHost(host); err != nil {
		t.Fatal(err)
	}
	if err := d.UnregisterHost(host); err == nil {
		t.Error("unregistering twice succeeded")
	}
	if err := d.RegisterHost(nil); !errors.Is(err, cudaipc.ErrInvalidValue) {
		t.Errorf("RegisterHost(nil): %v, want ErrInvalidValue", err)
	}
}

func TestPeerCopy(t *testing.T) {
	devs := devices(t, 2)
	d0, d1 := devs[0], devs[1]
	if self, err := d0.CanAccessPeer(d0); err != nil || self {
		t.Errorf("CanAccessPeer(self) = %v, %v; want false", self, err)
	}
	direct, err := d0.CanAccessPeer(d1)
	if err != nil {
		t.Fatal(err)
	}
	if cudaipc.Emulated && !direct {
		t.Error("emulated GPUs should reach each other")
	}
	t.Logf("peer access 0→1: %v", direct)
	const n = 1<<20 + 5
	a0, a1 := alloc(t, d0, 2<<20), alloc(t, d1, 2<<20)
	write(t, d0, a0.Ptr(), pattern(n, 3))
	s := stream(t, d0)
	if err := d0.CopyPeerAsync(a1.Ptr()+8, d1, a0.Ptr(), n, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readBack(t, d1, a1.Ptr()+8, n), pattern(n, 3)) {
		t.Error("peer copy changed the bytes")
	}
}

func TestIPCSameProcess(t *testing.T) {
	d := devices(t, 1)[0]
	a := alloc(t, d, 1<<20)
	h, err := a.IPCHandle()
	if err != nil {
		t.Fatal(err)
	}
	if h2, err := a.IPCHandle(); err != nil || h2 != h {
		t.Errorf("second export: %v, handle changed %v", err, h2 != h)
	}
	if m, err := d.OpenIPC(h); !errors.Is(err, cudaipc.ErrSameProcess) {
		if err == nil {
			m.Close()
		}
		t.Errorf("OpenIPC in the exporting process: %v, want ErrSameProcess", err)
	}
}

func TestIPCBadHandle(t *testing.T) {
	d := devices(t, 1)[0]
	var h cudaipc.IPCHandle
	copy(h[:], "garbage")
	if m, err := d.OpenIPC(h); !errors.Is(err, cudaipc.ErrInvalidHandle) {
		if err == nil {
			m.Close()
		}
		t.Errorf("OpenIPC(garbage): %v, want ErrInvalidHandle", err)
	}
}

// runHelper re-runs the test binary as a peer process in role and returns its
// exit code and stdout.
func runHelper(t *testing.T, role string, env ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{envHelper + "=" + role}, env...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	if stderr.Len() > 0 {
		t.Logf("helper %s stderr: %s", role, stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stdout.String()
}

func openInPeer(t *testing.T, d cudaipc.Device, h cudaipc.IPCHandle, size int) int {
	t.Helper()
	u := d.Info().UUID
	code, _ := runHelper(t, "open-check-write",
		envHandle+"="+hex.EncodeToString(h[:]),
		envUUID+"="+hex.EncodeToString(u[:]),
		fmt.Sprintf("%s=%d", envSize, size))
	return code
}

// The exporter fills an arena, a second process opens it through the handle,
// checks the bytes and writes new ones, which the exporter then reads.
func TestIPCOtherProcess(t *testing.T) {
	d := devices(t, 1)[0]
	const n = 2<<20 + 31
	a := alloc(t, d, 4<<20)
	write(t, d, a.Ptr(), pattern(n, 1))
	h, err := a.IPCHandle()
	if err != nil {
		t.Fatal(err)
	}
	if code := openInPeer(t, d, h, n); code != exitOK {
		t.Fatalf("peer process exited %d", code)
	}
	if !bytes.Equal(readBack(t, d, a.Ptr(), n), pattern(n, 2)) {
		t.Fatal("the exporter does not see the peer's writes")
	}
}

func TestIPCFreedArena(t *testing.T) {
	d := devices(t, 1)[0]
	a, err := d.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	h, err := a.IPCHandle()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(); err != nil {
		t.Fatal(err)
	}
	if code := openInPeer(t, d, h, 1<<20); code != exitInvalidHandle {
		t.Fatalf("peer opening a freed arena's handle exited %d, want %d (ErrInvalidHandle)", code, exitInvalidHandle)
	}
}

func TestIPCExporterExited(t *testing.T) {
	d := devices(t, 1)[0]
	code, out := runHelper(t, "export-and-exit")
	if code != exitOK {
		t.Fatalf("exporter exited %d", code)
	}
	line, _ := bufio.NewReader(strings.NewReader(out)).ReadString('\n')
	b, err := hex.DecodeString(strings.TrimSpace(line))
	var h cudaipc.IPCHandle
	if err != nil || len(b) != len(h) {
		t.Fatalf("exporter printed %q", out)
	}
	copy(h[:], b)
	if m, err := d.OpenIPC(h); !errors.Is(err, cudaipc.ErrInvalidHandle) {
		if err == nil {
			m.Close()
		}
		t.Errorf("OpenIPC after the exporter exited: %v, want ErrInvalidHandle", err)
	}
}

// Stream order and events under a held stream: nothing queued behind the
// hold runs, an event recorded behind it stays incomplete (Query) while an
// event on another stream completes, and releasing the hold runs the copies
// in order before the event. The emulated device only (HoldStream).
func TestHoldStreamOrdersEvents(t *testing.T) {
	if !cudaipc.Emulated {
		t.Skip("HoldStream is a hook of the emulated device")
	}
	d := devices(t, 1)[0]
	const n = 64 << 10
	a := alloc(t, d, 2*n)
	held, free := stream(t, d), stream(t, d)
	evHeld, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer evHeld.Close()
	evFree, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer evFree.Close()

	release, err := cudaipc.HoldStream(held)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	first, second := pattern(n, 1), pattern(n, 2)
	out := make([]byte, n)
	// Two writes to the same address then a read: order decides the bytes.
	for _, b := range [][]byte{first, second} {
		if err := d.CopyHtoDAsync(a.Ptr(), b, held); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.CopyDtoHAsync(out, a.Ptr(), held); err != nil {
		t.Fatal(err)
	}
	if err := evHeld.Record(held); err != nil {
		t.Fatal(err)
	}
	// Another stream is not held back.
	if err := d.CopyHtoDAsync(a.Ptr()+n, first, free); err != nil {
		t.Fatal(err)
	}
	if err := evFree.Record(free); err != nil {
		t.Fatal(err)
	}
	if err := evFree.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if done, err := evHeld.Query(); err != nil || done {
		t.Fatalf("event behind a hold: done %v, %v; want pending", done, err)
	}
	release()
	release() // idempotent
	if err := evHeld.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, second) {
		t.Fatal("copies on one stream ran out of order")
	}
	if _, err := cudaipc.HoldStream(nil); !errors.Is(err, cudaipc.ErrInvalidValue) {
		t.Fatalf("hold of a nil stream: %v, want ErrInvalidValue", err)
	}
}
