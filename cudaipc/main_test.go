package cudaipc_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/cudaipc"
)

// The test binary re-runs itself as the peer process of the IPC tests
// (os/exec's helper-process pattern): envHelper names the role.
const (
	envHelper = "KVTIER_CUDAIPC_HELPER"
	envHandle = "KVTIER_CUDAIPC_HANDLE" // hex IPC handle
	envUUID   = "KVTIER_CUDAIPC_UUID"   // hex device UUID to open it on
	envSize   = "KVTIER_CUDAIPC_SIZE"   // bytes of the pattern
)

// Exit codes of the helper, so that the parent can tell outcomes apart.
const (
	exitOK            = 0
	exitFailed        = 1
	exitInvalidHandle = 3
	exitSameProcess   = 4
)

func TestMain(m *testing.M) {
	enterMDWE()
	if role := os.Getenv(envHelper); role != "" {
		os.Exit(helper(role))
	}
	if cudaipc.Emulated && os.Getenv(cudaipc.EnvEmulatedGPUs) == "" {
		// Two small emulated GPUs: enough for peer copies, cheap to map.
		os.Setenv(cudaipc.EnvEmulatedGPUs, "2:64MiB")
	}
	goleak.VerifyTestMain(m)
}

func helper(role string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "helper %s: "+format+"\n", append([]any{role}, args...)...)
		return exitFailed
	}
	devs, err := cudaipc.Devices()
	if err != nil {
		return fail("%v", err)
	}
	defer func() {
		for _, d := range devs {
			d.Close()
		}
	}()
	switch role {
	case "export-and-exit":
		// Export an arena, print its handle and exit without freeing.
		a, err := devs[0].Alloc(1 << 20)
		if err != nil {
			return fail("%v", err)
		}
		h, err := a.IPCHandle()
		if err != nil {
			return fail("%v", err)
		}
		fmt.Println(hex.EncodeToString(h[:]))
		return exitOK
	case "open-check-write":
	default:
		return fail("unknown role")
	}

	// open-check-write: open the parent's arena, check it holds
	// pattern(size, 1), overwrite it with pattern(size, 2).
	var h cudaipc.IPCHandle
	var u cudaipc.UUID
	if b, err := hex.DecodeString(os.Getenv(envHandle)); err != nil || len(b) != len(h) {
		return fail("bad %s", envHandle)
	} else {
		copy(h[:], b)
	}
	if b, err := hex.DecodeString(os.Getenv(envUUID)); err != nil || len(b) != len(u) {
		return fail("bad %s", envUUID)
	} else {
		copy(u[:], b)
	}
	var size int
	if _, err := fmt.Sscan(os.Getenv(envSize), &size); err != nil {
		return fail("bad %s", envSize)
	}
	var dev cudaipc.Device
	for _, d := range devs {
		if d.Info().UUID == u {
			dev = d
		}
	}
	if dev == nil {
		return fail("no device %s", u)
	}
	mp, err := dev.OpenIPC(h)
	switch {
	case errors.Is(err, cudaipc.ErrInvalidHandle):
		fmt.Fprintln(os.Stderr, err)
		return exitInvalidHandle
	case errors.Is(err, cudaipc.ErrSameProcess):
		return exitSameProcess
	case err != nil:
		return fail("open: %v", err)
	}
	defer mp.Close()
	if mp.Size() < int64(size) {
		return fail("mapping of %d bytes, want ≥ %d", mp.Size(), size)
	}
	s, err := dev.NewStream()
	if err != nil {
		return fail("%v", err)
	}
	defer s.Close()
	got := make([]byte, size)
	if err := dev.CopyDtoHAsync(got, mp.Ptr(), s); err != nil {
		return fail("%v", err)
	}
	if err := s.Synchronize(); err != nil {
		return fail("%v", err)
	}
	if !bytes.Equal(got, pattern(size, 1)) {
		return fail("mapping does not hold the exporter's bytes")
	}
	if err := dev.CopyHtoDAsync(mp.Ptr(), pattern(size, 2), s); err != nil {
		return fail("%v", err)
	}
	if err := s.Synchronize(); err != nil {
		return fail("%v", err)
	}
	if err := mp.Close(); err != nil {
		return fail("%v", err)
	}
	return exitOK
}

// pattern is size bytes that differ per seed and per position.
func pattern(size int, seed byte) []byte {
	b := make([]byte, size)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}
