package shm

import (
	"encoding/json"
	"fmt"
	"math"
)

// Stats is the daemon's status report, sent as JSON in MsgStatsReply. JSON
// keeps the report extensible without a version bump; it is not on any hot
// path.
type Stats struct {
	Version       string      `json:"version"`
	PID           int         `json:"pid"`
	UptimeSeconds float64     `json:"uptime_seconds"`
	Socket        string      `json:"socket"`
	StateDir      string      `json:"state_dir"`
	Tiers         []TierStats `json:"tiers"`
	Sessions      int         `json:"sessions"`
	SessionsTotal uint64      `json:"sessions_total"`
	SessionsBad   uint64      `json:"sessions_closed_hostile"`
	// Namespaces lists those with sessions first, then the others by id,
	// as many as fit a bound of the reply's size; NamespacesTotal counts
	// every registered one.
	Namespaces      []NamespaceStats  `json:"namespaces"`
	NamespacesTotal int               `json:"namespaces_total"`
	Ops             map[string]uint64 `json:"ops"`
	Moves           []MoveStats       `json:"moves"`
	ParkedBlocks    int               `json:"parked_blocks"`
	// EBPF says which eBPF probes run (program name → loaded).
	EBPF map[string]bool `json:"ebpf,omitempty"`
	// MemoryPressure is the host memory pressure controller's state.
	MemoryPressure *MemoryPressure `json:"memory_pressure,omitempty"`
}

// MemoryPressure is the state of the controller that shrinks the host
// tier's target under host memory pressure.
type MemoryPressure struct {
	Source      string  `json:"source"`       // "vmscan" (eBPF) or "psi"
	Pressure    float64 `json:"pressure_pct"` // last sample: share of time stalled on memory
	SomeAvg10   float64 `json:"some_avg10"`   // the host's PSI some avg10 (-1 unreadable)
	TargetRatio float64 `json:"target_ratio"` // 1 full host tier; lower: watermarks scaled down
	Shrinks     uint64  `json:"shrinks"`
	Grows       uint64  `json:"grows"`
}

// TierStats describes one tier.
type TierStats struct {
	Name          string  `json:"name"`
	CapacityBytes int64   `json:"capacity_bytes"`
	UsedBytes     int64   `json:"used_bytes"`
	Blocks        int     `json:"blocks"`
	Reserved      int     `json:"reserved"`
	Leased        int     `json:"leased"`
	Hits          uint64  `json:"hits"`
	Misses        uint64  `json:"misses"`
	Evictions     uint64  `json:"evictions"`
	HitRatio      float64 `json:"hit_ratio"`
	HugePages     bool    `json:"hugepages"`
	// Host tier: the slab size of its allocator (each slab holds whole
	// blocks of one size).
	SlabBytes int64 `json:"slab_bytes,omitempty"`
	// Host tier with an NVMe tier below it: the configured share of its
	// capacity above which it demotes (the most it keeps at rest; omitted
	// when it has nowhere to demote and fills to its capacity).
	HighWatermark float64 `json:"high_watermark,omitempty"`
	// Host tier: slabs freed by compaction and the blocks it moved.
	Compactions     uint64 `json:"compactions,omitempty"`
	CompactedBlocks uint64 `json:"compacted_blocks,omitempty"`
	// GPU tiers (one row per GPU arena, "gpu0", "gpu1", …): blocks demoted
	// to the host tier (the GPU arenas never evict).
	Demotions uint64 `json:"demotions,omitempty"`
	// PromotionFallbacks: device reads of host blocks served from the host
	// tier because the arena had no room to promote them.
	PromotionFallbacks uint64 `json:"promotion_fallbacks,omitempty"`
	// NVMe tier: bytes on disk and reads that failed verification.
	DiskBytes      int64  `json:"disk_bytes,omitempty"`
	ChecksumMisses uint64 `json:"checksum_misses,omitempty"`
}

// MoveStats counts blocks moved between two tiers.
type MoveStats struct {
	From    string  `json:"from"`
	To      string  `json:"to"`
	Blocks  uint64  `json:"blocks"`
	Bytes   uint64  `json:"bytes"`
	Errors  uint64  `json:"errors"`
	Seconds float64 `json:"seconds"` // time spent copying
}

// NamespaceStats describes one registered namespace.
type NamespaceStats struct {
	ID        uint32    `json:"id"`
	Namespace Namespace `json:"namespace"`
	Sessions  int       `json:"sessions"`
}

// DecodeStats parses a MsgStatsReply payload: bounded as any control
// message, with counts no daemon sends refused. A daemon older than
// namespaces_total sends none: it listed every namespace, so the list's
// length is the total.
func DecodeStats(p []byte) (Stats, error) {
	var st Stats
	if len(p) > MaxControlMsg {
		return Stats{}, fmt.Errorf("%w: stats: %d bytes, more than a control message's %d", ErrMalformed, len(p), MaxControlMsg)
	}
	if err := json.Unmarshal(p, &st); err != nil {
		return Stats{}, fmt.Errorf("%w: stats: %v", ErrMalformed, err)
	}
	switch {
	case st.NamespacesTotal == 0:
		st.NamespacesTotal = len(st.Namespaces)
	case st.NamespacesTotal < len(st.Namespaces) || int64(st.NamespacesTotal) > math.MaxUint32:
		// Namespace ids are uint32: there cannot be more.
		return Stats{}, fmt.Errorf("%w: stats: namespaces_total %d with %d listed", ErrMalformed, st.NamespacesTotal, len(st.Namespaces))
	}
	return st, nil
}
