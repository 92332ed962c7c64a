// Command gpucheck measures the GPU data paths kvtier uses against plain
// baselines on one device and prints the ratios (scripts/gpu-check.sh runs
// it built with -tags cuda on a GPU host):
//
//   - H2D/D2H through a pinned kvtier host arena (a memfd region registered
//     with RegisterHost) vs a plain pinned anonymous mapping;
//   - D2D through a CUDA IPC mapping (a child process opens this process's
//     arena) vs a local D2D copy.
//
// Without -tags cuda it runs on the emulated device (KVTIER_EMULATED_GPUS).
package main

import (
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
)

const size = 256 << 20
const reps = 10

func must(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpucheck: %s: %v\n", what, err)
		os.Exit(1)
	}
}

func gbps(d time.Duration) float64 { return float64(size*reps) / d.Seconds() / 1e9 }

func timeIt(dev cudaipc.Device, s cudaipc.Stream, f func() error) time.Duration {
	must(f(), "warm-up copy")
	must(s.Synchronize(), "sync")
	t0 := time.Now()
	for i := 0; i < reps; i++ {
		must(f(), "copy")
	}
	must(s.Synchronize(), "sync")
	return time.Since(t0)
}

func main() {
	devs, err := cudaipc.Devices()
	must(err, "devices")
	dev := devs[0]
	s, err := dev.NewStream()
	must(err, "stream")
	if len(os.Args) == 3 && os.Args[1] == "child" { // D2D through the IPC mapping
		var h cudaipc.IPCHandle
		b, err := hex.DecodeString(os.Args[2])
		must(err, "handle")
		copy(h[:], b)
		m, err := dev.OpenIPC(h)
		must(err, "open ipc")
		local, err := dev.Alloc(size)
		must(err, "alloc")
		d := timeIt(dev, s, func() error { return dev.CopyDtoDAsync(local.Ptr(), m.Ptr(), size, s) })
		fmt.Printf("%f\n", gbps(d))
		m.Close()
		local.Free()
		return
	}
	a, err := dev.Alloc(size)
	must(err, "alloc")
	b, err := dev.Alloc(size)
	must(err, "alloc")

	plain, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	must(err, "mmap")
	must(dev.RegisterHost(plain), "register plain")
	reg, err := shm.CreateRegion("kvtier-gpucheck", size, false)
	must(err, "host arena")
	arena := reg.Bytes()
	must(dev.RegisterHost(arena), "register arena")

	h2dBase := timeIt(dev, s, func() error { return dev.CopyHtoDAsync(a.Ptr(), plain, s) })
	d2hBase := timeIt(dev, s, func() error { return dev.CopyDtoHAsync(plain, a.Ptr(), s) })
	h2d := timeIt(dev, s, func() error { return dev.CopyHtoDAsync(a.Ptr(), arena, s) })
	d2h := timeIt(dev, s, func() error { return dev.CopyDtoHAsync(arena, a.Ptr(), s) })
	d2dLocal := timeIt(dev, s, func() error { return dev.CopyDtoDAsync(b.Ptr(), a.Ptr(), size, s) })

	h, err := a.IPCHandle()
	must(err, "export")
	out, err := exec.Command(os.Args[0], "child", hex.EncodeToString(h[:])).Output()
	must(err, "child")
	var ipc float64
	_, err = fmt.Sscanf(strings.TrimSpace(string(out)), "%f", &ipc)
	must(err, "child output")

	fmt.Printf("device %s (emulated=%v), %d MiB x %d\n", dev.Info().Name, cudaipc.Emulated, size>>20, reps)
	fmt.Printf("H2D  host arena %.1f GB/s  plain pinned %.1f GB/s  ratio %.2f\n", gbps(h2d), gbps(h2dBase), gbps(h2d)/gbps(h2dBase))
	fmt.Printf("D2H  host arena %.1f GB/s  plain pinned %.1f GB/s  ratio %.2f\n", gbps(d2h), gbps(d2hBase), gbps(d2h)/gbps(d2hBase))
	fmt.Printf("D2D  via IPC    %.1f GB/s  local        %.1f GB/s  ratio %.2f\n", ipc, gbps(d2dLocal), ipc/gbps(d2dLocal))
	dev.UnregisterHost(arena)
	dev.UnregisterHost(plain)
	reg.Close()
	unix.Munmap(plain)
	a.Free()
	b.Free()
	s.Close()
}
