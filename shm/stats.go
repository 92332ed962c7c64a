package shm

// Stats is the daemon's status report, sent as JSON in MsgStatsReply. JSON
// keeps the report extensible without a version bump; it is not on any hot
// path.
type Stats struct {
	Version       string            `json:"version"`
	PID           int               `json:"pid"`
	UptimeSeconds float64           `json:"uptime_seconds"`
	Socket        string            `json:"socket"`
	StateDir      string            `json:"state_dir"`
	Tiers         []TierStats       `json:"tiers"`
	Sessions      int               `json:"sessions"`
	SessionsTotal uint64            `json:"sessions_total"`
	SessionsBad   uint64            `json:"sessions_closed_hostile"`
	Namespaces    []NamespaceStats  `json:"namespaces"`
	Ops           map[string]uint64 `json:"ops"`
	Moves         []MoveStats       `json:"moves"`
	ParkedBlocks  int               `json:"parked_blocks"`
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
	// Host tier: slabs freed by compaction and the blocks it moved.
	Compactions     uint64 `json:"compactions,omitempty"`
	CompactedBlocks uint64 `json:"compacted_blocks,omitempty"`
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
