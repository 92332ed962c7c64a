//go:build !cuda && !linux

package cudaipc

import "fmt"

// EnvEmulatedGPUs configures the emulated devices on Linux; elsewhere there
// are none.
const EnvEmulatedGPUs = "KVTIER_EMULATED_GPUS"

// Emulated reports whether this build emulates the GPUs.
const Emulated = true

// Devices finds no GPU: the emulated devices need memfd (Linux).
func Devices() ([]Device, error) {
	return nil, fmt.Errorf("emulated devices need Linux: %w", ErrNoDevice)
}

// HoldStream needs an emulated stream, which needs Linux.
func HoldStream(s Stream) (release func(), err error) {
	return nil, fmt.Errorf("hold stream: %w", ErrNotSupported)
}
