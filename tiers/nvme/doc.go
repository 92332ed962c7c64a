// Package nvme is kvtier's NVMe tier: a checksummed block store on Badger
// v4 in a directory of the daemon's state dir, with an in-memory index, a
// byte budget enforced by LRU eviction and value-log GC, and a key-only
// reindex at start.
//
// # Ownership
//
//   - Store owns the *badger.DB from Open to Close, a flock on Dir+".lock"
//     (beside the directory, so a corrupt directory can be moved aside
//     without moving the lock), and exactly one goroutine: the maintenance
//     loop (LSM flush of pending deletions, value-log GC, disk measurement,
//     adaptive eviction). It runs under a context the Store creates; Open's
//     ctx bounds only the open and reindex. Close cancels the loop, waits
//     for it and for operations in flight, then closes badger, which stops
//     all of badger's goroutines (the tests run goleak.VerifyTestMain).
//   - The in-memory index (key → size, LRU list) is owned by Store under
//     one mutex; it holds no pointers (~40 B/entry + map slot).
//   - Get copies into the caller's dst; Put copies the caller's block into
//     a pooled buffer with the header in front (badger needs one slice).
//     Neither keeps a reference to caller memory after returning.
//
// # On-disk format
//
// Key (21 bytes): 0x01 | namespace uint32 big-endian | hash.Hi uint64 BE |
// hash.Lo uint64 BE. Big-endian keeps a namespace contiguous in key order.
// Key 0xFE (empty value) is a maintenance marker, written and dropped to
// force a memtable flush (see gc.go); no other prefixes are used.
//
// Value: a 32-byte header followed by the payload:
//
//	off size field
//	0   4    magic "kvtB"
//	4   1    format version (1)
//	5   1    flags (0)
//	6   2    reserved (0)
//	8   8    payload length, uint64 little-endian
//	16  16   XXH3-128 (Hi, Lo; LE) of payload, seeded with XXH3-64 of
//	         (key ‖ header[0:16])
//
// Binding the key into the checksum means a value that is intact but
// reached through the wrong key (a damaged value pointer) also fails.
// ValueThreshold equals the header size, so every block lives in the value
// log and the LSM holds only keys and value pointers.
//
// # Reads
//
// Get copies the payload into dst and verifies the copy (never the mmap a
// second time). A length or checksum mismatch, or badger failing to read
// the value (damaged or missing value-log file), is a miss counted in
// Stats.ChecksumMisses; the key is deleted. Get never returns wrong bytes.
// Badger's own VerifyValueChecksum stays off (one CRC over the whole entry
// per read, redundant with ours).
//
// Caveat (badger v4.9.6): value-log GC of a file with a damaged entry stops
// at the first bad entry and still deletes the file, so live blocks after
// the damage become unreadable. They read as misses (counted), never wrong.
//
// # Crash safety
//
// With SyncWrites false (the default) a Put is in the page cache when it
// returns: it survives a kill -9 of the daemon, not a power loss. After any
// crash badger replays its WAL and truncates torn value-log tails; blocks
// that did not make it are misses, torn or damaged ones fail verification.
// TestCrashMidWrite kills a writer process with SIGKILL at random moments;
// TestTornValueLogTail cuts and garbles the value-log tail.
//
// If badger cannot open the directory (e.g. truncated MANIFEST) for a reason
// other than permissions, a full or read-only disk, or a held lock, Open
// renames it to Dir.corrupt-<unix seconds>, logs a warning, keeps only the
// newest such directory, and starts empty.
//
// # Recency after restart
//
// Open iterates keys only (PrefetchValues false) and orders the LRU by the
// badger commit version, i.e. write order. Reads are not persisted (that
// would mean a write per hit); in the tier chain a block that is read is
// promoted and, when demoted again, Put anew, which refreshes its version.
// Sizes come from Item.ValueSize, inverted exactly (sizeFromValueSize,
// pinned by TestReindexExactSizes).
//
// # Byte budget
//
// A block is charged len(payload)+192 bytes (header, value-log entry, LSM
// entry). Put evicts least-recently-used blocks (in the same badger
// transaction as the new block) while the charged total would exceed the
// logical limit:
//
//	limit = min(C − 2·F − T − 4 MiB, 0.9·C) − penalty
//
// where C is CapacityBytes, F the value-log file size (C/32 clamped to
// [16 MiB, 1 GiB)) and T the pending-deletion threshold (C/32 clamped to
// [F, 4F]). The reserve covers the head value-log file (never collectable),
// deletions badger does not know yet, and one partly dead file.
//
// Badger's value-log GC picks files only from discard stats, which are
// produced by LSM compactions — with keys-only memtables of ~100 B/entry a
// memtable would not fill for many GiB of blocks. So the maintenance loop
// forces a memtable flush + L0 compaction (DropPrefix of the marker key)
// once T bytes were deleted (or every GCInterval if any), then runs
// RunValueLogGC(0.5) until ErrNoRewrite. BaseLevelSize 256 MiB keeps the key
// LSM in one level up to ~4M blocks, so that compaction reaches the bottom
// and counts every deleted block at once. It then measures the allocated
// size of the directory (st_blocks, since badger's files are sparse
// preallocations); above C − F/2 it runs GC at 0.2 and, if still over,
// raises the penalty by the excess and evicts down to the new limit (the
// penalty decays when usage is back under). Put refuses with ErrNoSpace
// (after waiting ≤1 s for a pass) if the measured usage plus bytes written
// since would exceed C. DeleteNS writes tombstones rather than using
// badger's DropPrefix, which drops memtable keys and whole tables without
// recording discard stats and would leak their value-log space forever.
//
// Measured (TestDiskBudget, C = 128 MiB, 3·C of 256 KiB blocks written):
// peak directory size ~112–117 MiB, logical limit 76 MiB (the fixed reserve
// dominates at small C; at C ≥ ~2 GiB the limit is 0.9·C).
//
// # Concurrency
//
// All methods are safe for concurrent use. Per-key stripes serialize
// writers of the same key; eviction skips keys whose stripe is busy. A
// store-wide gate lets badger writes run concurrently but excludes them
// during forced flushes and DeleteNS (badger's DropPrefix fails concurrent
// writes). Under the race detector value-log GC also takes the gate: see
// gcOnce for the badger race it avoids.
package nvme
