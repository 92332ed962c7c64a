// Package nvme is kvtier's NVMe tier: a checksummed block store in a
// directory of the daemon's state dir, with Badger v4 as the persistent
// index and block payloads in append-only segment files written with
// direct I/O, an in-memory index, a byte budget enforced by LRU eviction
// and segment compaction, and an index-only reindex at start.
//
// # Ownership
//
//   - Store owns the *badger.DB and the segment files from Open to Close, a
//     flock on Dir+".lock" (beside the directory, so a corrupt directory can
//     be moved aside without moving the lock), and one long-lived goroutine:
//     the maintenance loop (removal and compaction of segments, disk
//     measurement, adaptive eviction). Put runs the checksum of a large
//     block on a short-lived goroutine it waits for. It runs under a context the Store creates; Open's
//     ctx bounds only the open and reindex. Close cancels the loop, waits
//     for it and for operations in flight, then closes badger, which stops
//     all of badger's goroutines (the tests run goleak.VerifyTestMain).
//   - The in-memory index (key → size, segment, LRU list) is owned by Store
//     under one mutex; it holds no pointers (48 B/entry + map slot).
//   - Get reads into the caller's dst; Put writes from the caller's block
//     (or a pooled aligned copy). Neither keeps a reference to caller memory
//     after returning.
//   - PutBatch is Put for several blocks: in chunks of up to 1 MiB it
//     writes their records back to back with one pwritev (or one write of
//     a bounce buffer when a block is unaligned for direct I/O) and commits
//     their index records in one badger transaction. Small blocks then cost
//     one I/O per chunk: 64 KiB blocks went in at 1,387 MB/s from one
//     goroutine instead of 490 MB/s (docs/benchmarks.md, "Batched NVMe
//     writes"). Put is PutBatch of one block.
//
// # On-disk format (version 2)
//
// WiscKey-style: badger is only the index; block payloads live in
// append-only segment files Dir/segments/NNNNNNNN.seg written with direct
// I/O (O_DIRECT; filesystems that refuse it, e.g. some tmpfs, get buffered
// I/O). Version 1 kept payloads in badger's value log, which badger writes
// by memcpy into an mmap of a sparse file: page faults plus a final msync
// capped Put at 17–27% of raw direct-I/O bandwidth (TestRawVsStore). A
// directory in the old format is emptied at Open (it is a cache).
//
// Badger key (21 bytes): 0x01 | namespace uint32 big-endian | hash.Hi uint64
// BE | hash.Lo uint64 BE. Big-endian keeps a namespace contiguous in key
// order. Badger value: the 48-byte index record (see format.go: magic
// "kvtI", version 2, payload length, XXH3-128 of the payload seeded with
// XXH3-64 of (key ‖ record[0:16]), segment id, offset), kept inline in the
// LSM.
//
// Segment record: the payload, zero-padded to the direct-I/O offset
// alignment of the filesystem (statx STATX_DIOALIGN, ≥ 512 B), at an
// aligned offset. A payload that is aligned in memory and a multiple of the
// alignment (a 2 MiB host-tier slot) is written and read with no copy; other
// payloads go through a pooled aligned buffer. nLanes (2) segments are
// appended to concurrently, each sequentially by one writer at a time; a
// lane moves to a new segment beyond the segment size (capacity/32 clamped
// to [16 MiB, 1 GiB)). Segments are never appended to after a restart.
//
// Binding the key into the checksum means a payload that is intact but
// reached through the wrong record (a damaged pointer) also fails.
//
// # Reads
//
// Get looks the record up in badger, reads the payload into dst (direct
// I/O), and verifies the copy in dst. A length or checksum mismatch, a
// short read, or a malformed record is a miss counted in
// Stats.ChecksumMisses; the key is deleted. Get never returns wrong bytes.
//
// # Crash safety
//
// Put writes the payload to its segment, then commits the record to
// badger. With SyncWrites false (the default) a Put survives a kill -9 of
// the daemon (the direct write has reached the device; the record is in
// badger's WAL in the page cache) but not necessarily a power loss; Sync
// (fdatasync of the segments written since, then badger's WAL) makes
// everything so far durable; Close does the same. After any crash badger
// replays its WAL; records that point into a missing segment or past its
// end (a torn tail) are dropped at Open, and payloads that did not make it
// fail verification on read. A PutBatch chunk is the same: its records
// commit in one transaction after its one write. TestCrashMidWrite kills a
// writer process (Puts, batches of three, deletes) with SIGKILL at random
// moments; TestTornValueLogTail cuts and garbles the head
// segment; TestCorruptValueLog flips bytes in a segment.
//
// Badger writes its log and tables through shared mappings of sparse files,
// where a write past the filesystem's free space is SIGBUS, not an error.
// Put keeps a reserve free (see "Byte budget"); what writes index records
// without a Put first (eviction, deletions, drops of corrupt blocks,
// compaction) checks the free space and stops when there is none. A
// deletion the filesystem has no room to log (Delete, DeleteNS) still takes
// the block out of the index at once, and the maintenance pass (or Close)
// writes its tombstone once there is room; only a restart while the
// filesystem is still full finds such a block again. Open refuses with
// ErrNoSpace when the filesystem cannot take the write-ahead log a crash
// left to replay.
//
// If badger cannot open the directory (e.g. a MANIFEST that does not parse,
// a damaged table) for a reason other than permissions, a full or read-only
// disk, or a held lock, Open renames it to Dir.corrupt-<unix seconds>, logs
// a warning, keeps only the newest such directory, and starts empty.
//
// A MANIFEST cut short or missing does parse, to an older list of tables,
// and badger deletes the tables it does not list; reindex then removed the
// segments no remaining record pointed into (the whole cache, silently).
// Open moves such tables into Dir/unlisted before badger opens and then
// checks them against the index: a block whose newest version there is a
// record the index has nothing as new of is lost, and the directory, those
// tables with it, is moved aside as above. A crash leaves unlisted tables
// that lose nothing (a flush's output whose log badger replays, a
// compaction's output or inputs); they are removed. One that cannot be
// decoded counts as a write a crash cut short when badger's log was left
// to replay, else as a loss (TestTruncatedManifestMovedAside,
// TestCrashImageUnlistedTableOpensInPlace). Badger's Open cuts a torn
// MANIFEST tail (a change set a crash cut off); its bytes are kept in
// Dir/MANIFEST.torn-tail until the store has opened in place, so that a
// directory moved aside holds the MANIFEST as it was found.
//
// # Recency after restart
//
// Open iterates the index records (48 bytes each, inline in the LSM; no
// block data is read) and orders the LRU by the badger commit version,
// i.e. write order (a block moved by compaction counts as rewritten then);
// the blocks of one PutBatch chunk, committed together, by their order in
// the batch (their records' offsets).
// Reads are not persisted (that would mean a write per hit); in the tier
// chain a block that is read is promoted and, when demoted again, Put anew,
// which refreshes its version.
//
// # Byte budget
//
// A block is charged its record on disk (the payload padded to the
// direct-I/O alignment) plus 192 bytes (index record, LSM entry): a block
// far smaller than the alignment takes the alignment on disk, and charged
// less it would fill the disk under the limit's floor, where no penalty
// makes eviction free anything (TestSmallBlocksDoNotWedgeTheStore). Put
// evicts least-recently-used blocks (deleted in the same badger
// transaction as the new record) while the charged total would exceed the
// logical limit:
//
//	base  = max(min(C − 3·F − C/64 − 4 MiB, 0.9·C), C/4)
//	limit = max(base − penalty, C/8)
//
// where C is CapacityBytes and F the segment size. The reserve covers the
// two segments lanes append to (never collected), one partly dead segment
// and the badger index. Each segment tracks its live bytes; one whose live
// bytes drop to zero is removed by the maintenance loop (woken at once);
// one at least half dead is compacted (its live blocks are verified,
// appended to a lane and their records repointed, then it is removed). The
// loop then measures the allocated size of the directory (st_blocks); above
// C − F/2 it compacts at 20% dead and, if still over, raises the penalty by
// the excess and evicts down to the new limit (the penalty decays when
// usage is back under). Put refuses with ErrNoSpace (after waiting ≤1 s for
// a pass) if the measured usage plus bytes written since would exceed C, or
// when the filesystem reports ENOSPC/EDQUOT.
//
// Measured (TestDiskBudget, C = 128 MiB, 3·C of 256 KiB blocks written):
// peak directory size ~112 MiB, logical limit 74 MiB.
//
// # Throughput
//
// TestRawVsStore (-nvme.rawbench) measures Put+Sync and cold Get of 2 MiB
// blocks against raw sequential O_DIRECT I/O on the same filesystem in the
// same run; see docs/benchmarks.md ("NVMe tier vs raw direct I/O"). The Put
// path costs one XXH3-128 pass over the block (overlapped with the write
// for blocks ≥ 256 KiB) and one badger commit of 48 bytes; Get one badger
// lookup and one XXH3-128 pass.
//
// # Concurrency
//
// All methods are safe for concurrent use. Per-key stripes serialize
// writers of the same key (Put, Delete, compaction's relocation); eviction
// and compaction skip keys whose stripe is busy. A store-wide gate lets
// writes run concurrently but excludes them during DeleteNS. Delete never
// waits for another write (the daemon calls it on a client's ring loop,
// where a write to a slow disk holding the stripe would stall the ring):
// when the stripe or the gate is busy it hides the block at once (reads
// and Keys no longer see it) and the store's deleter goroutine deletes it
// when the lock is free, unless a Put of the key that began after the
// Delete stored it again; Close deletes what is left. Such a Delete logs
// the block's tombstone before it returns, as any Delete does, so a crash
// does not undo it (TestHiddenDeleteSurvivesACrash); only one the
// filesystem had no room to log is undone by a restart. Two Puts write
// to two lanes (segments) at once; a segment is closed only under its
// write lock, after reads in flight finish, and a Get that finds its
// segment gone (relocated meanwhile) looks the record up again.
package nvme
