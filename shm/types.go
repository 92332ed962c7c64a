package shm

import "fmt"

// Hash is the 128-bit chained block hash that identifies a block inside a
// namespace. The daemon treats it as opaque.
type Hash struct{ Hi, Lo uint64 }

func (h Hash) String() string { return fmt.Sprintf("%016x%016x", h.Hi, h.Lo) }

// Tier identifies a storage tier on the wire. Zero means "not cached".
type Tier uint8

const (
	TierNone Tier = 0
	TierGPU  Tier = 1
	TierHost Tier = 2
	TierNVMe Tier = 3
)

func (t Tier) String() string {
	switch t {
	case TierNone:
		return "none"
	case TierGPU:
		return "gpu"
	case TierHost:
		return "host"
	case TierNVMe:
		return "nvme"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}
