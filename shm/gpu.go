package shm

import "fmt"

// GPU tier wire additions.
//
// A Hello naming a GPU (GPUUUID non-zero) whose UUID matches one of the
// daemon's GPU arenas gets a Welcome with WelcomeFlagGPU set, followed by one
// MsgGPUArena message describing that arena:
//
//	layout version u32 (=1) | uuid [16] | arena size u64 | slab bytes u64 | ipc handle [64]
//
// A client that did not name a GPU never sees either. Slots in that arena are
// answered with CQE.Tier = TierGPU and CQE.Offset into the arena; the daemon
// gives them only to entries that carry SQEFlagDevice.
const (
	MsgGPUArena MsgType = 10

	// WelcomeFlagGPU: a MsgGPUArena message follows the Welcome.
	WelcomeFlagGPU = 1 << 0

	// SQEFlagDevice on a reserve or acquire: the client copies with its GPU
	// and can take a slot in its GPU's arena (CQE.Tier = TierGPU).
	SQEFlagDevice = 1 << 1

	// GPUArenaVersion is the layout version of MsgGPUArena.
	GPUArenaVersion = 1
	// GPUHandleSize is the size of a CUDA IPC handle (CU_IPC_HANDLE_SIZE).
	GPUHandleSize = 64
)

// GPUArena describes the daemon's arena on the client's GPU.
type GPUArena struct {
	UUID      [16]byte
	Size      uint64
	SlabBytes uint64
	Handle    [GPUHandleSize]byte
}

// Encode returns the MsgGPUArena payload.
func (g *GPUArena) Encode() []byte {
	var w writer
	w.u32(GPUArenaVersion)
	w.raw(g.UUID[:])
	w.u64(g.Size)
	w.u64(g.SlabBytes)
	w.raw(g.Handle[:])
	return w.b
}

// DecodeGPUArena parses and checks a MsgGPUArena payload.
func DecodeGPUArena(p []byte) (GPUArena, error) {
	var g GPUArena
	r := reader{b: p}
	v := r.u32()
	if r.err == nil && v != GPUArenaVersion {
		return GPUArena{}, fmt.Errorf("%w: gpu arena: layout version %d, want %d", ErrMalformed, v, GPUArenaVersion)
	}
	copy(g.UUID[:], r.raw(16))
	g.Size = r.u64()
	g.SlabBytes = r.u64()
	copy(g.Handle[:], r.raw(GPUHandleSize))
	if err := r.done("gpu arena"); err != nil {
		return GPUArena{}, err
	}
	if g.Size == 0 || g.Size > 1<<50 {
		return GPUArena{}, fmt.Errorf("%w: gpu arena: size %d", ErrMalformed, g.Size)
	}
	if g.SlabBytes == 0 || g.SlabBytes > g.Size || g.Size%g.SlabBytes != 0 {
		return GPUArena{}, fmt.Errorf("%w: gpu arena: slab %d does not divide size %d", ErrMalformed, g.SlabBytes, g.Size)
	}
	return g, nil
}

// CheckSlot validates a completion's slot [off, off+n) against an arena of
// size bytes (both from peers: no wrap-around).
func CheckSlot(off, n, size uint64) error {
	if n > size || off > size-n {
		return fmt.Errorf("%w: slot [%d, +%d) outside the %d-byte arena", ErrMalformed, off, n, size)
	}
	return nil
}
