package nvme

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

var (
	// ErrNotFound: the block is not in the store. Corrupt or torn blocks
	// are reported as ErrNotFound too (wrapping ErrChecksum as well).
	ErrNotFound = errors.New("nvme: block not found")
	// ErrChecksum: the stored block failed verification; it has been
	// deleted. Always returned together with ErrNotFound.
	ErrChecksum = errors.New("nvme: block failed checksum")
	// ErrShortBuffer: dst is smaller than the block; Get returns the size.
	ErrShortBuffer = errors.New("nvme: destination buffer too small")
	// ErrTooLarge: the block exceeds MaxBlockBytes.
	ErrTooLarge = errors.New("nvme: block too large")
	// ErrNoSpace: the disk budget is exhausted and value-log GC did not
	// free space in time. The caller (the mover) drops the block.
	ErrNoSpace = errors.New("nvme: disk budget exhausted")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("nvme: store closed")
	// ErrLocked: another process holds the store directory.
	ErrLocked = errors.New("nvme: store directory locked")
)

// Options configures a Store.
type Options struct {
	// Dir is the badger directory (created if missing). A lock file
	// Dir+".lock" is created beside it.
	Dir string
	// CapacityBytes is the on-disk budget. The store keeps the allocated
	// size of Dir under it (see the package doc for the bound).
	// Must be at least MinCapacity. Store.SetCapacity changes the budget of
	// an open store; the segment file size (and so MaxBlockBytes) stays
	// the one computed from CapacityBytes at Open.
	CapacityBytes int64
	// Logger receives warnings (corruption, move-aside) and badger's logs.
	// Nil means slog.Default().
	Logger *slog.Logger
	// SyncWrites makes every Put fdatasync its segment and sync badger's
	// WAL before it returns. Default false: a Put is then durable against a
	// process crash (the payload was written with direct I/O, the index
	// record is in the page cache) but not against power loss or a kernel
	// crash; after such a loss the last blocks are misses, never wrong
	// bytes, because every read is verified. For a cache that trade is
	// right. Store.Sync gives the same durability for everything Put so far.
	SyncWrites bool
	// Unevictable, if set, marks keys the budget never evicts (parked
	// requests): they leave only by Delete. When they fill the budget, Put
	// fails with ErrNoSpace instead.
	Unevictable func(Key) bool
	// GCInterval is the period of the background maintenance loop
	// (value-log GC, LSM flush of pending deletions, disk measurement).
	// Zero means 10s. Large deletions also wake the loop immediately.
	GCInterval time.Duration

	// tune lets benchmarks override badger options. Not exported.
	tune func(*badger.Options)
}

// MinCapacity is the smallest accepted CapacityBytes: the store needs room
// for a couple of value-log files beside the data.
const MinCapacity = 64 << 20

// Stats is a snapshot of the store.
type Stats struct {
	Blocks int   // blocks in the index (not counting those a Delete hid)
	Bytes  int64 // logical bytes (payload sizes) of those blocks
	// UnevictableBytes is the part of Bytes that Options.Unevictable
	// marks (parked blocks).
	UnevictableBytes int64
	DiskBytes        int64 // allocated bytes of the directory (LSM + value log + manifest/WAL), last measurement
	Capacity         int64
	LogicalLimit     int64 // current eviction threshold for logical bytes (+per-block overhead)
	Hits, Misses     uint64
	ChecksumMisses   uint64 // reads that failed verification (also counted in Misses)
	Evictions        uint64 // blocks removed to stay under the budget
	Puts             uint64
	NoSpace          uint64 // Puts rejected with ErrNoSpace
	GCRuns           uint64 // segment files removed (emptied by deletes or compaction)
	Relocated        uint64 // blocks moved by segment compaction
	SegmentWrites    uint64 // segment file writes: one per Put, per chunk of a PutBatch, per relocated block
	SegmentReads     uint64 // segment file reads: one per Get, per relocated block, per run of back-to-back records of a GetBatch
	IndexWalks       uint64 // walks of the whole index under the store's lock (deletes of namespaces, Keys, Namespaces)
	ReindexBlocks    int
	ReindexDuration  time.Duration
	MovedAside       string // non-empty if Open found the directory corrupt and moved it here
}

const (
	nStripes = 64
	// blockOverhead is charged per block on top of its payload: our header
	// (32), badger's value-log entry (key+ts 29, varint header ≤ 8, crc 4),
	// and the LSM entry (key, value pointer, index and bloom share), rounded up.
	blockOverhead    = 192
	maxVictimsPerPut = 8192
	// fsReserve is kept free on the filesystem (a capacity larger than the
	// disk must not fill it): badger writes its memtable through an mmap of
	// a sparse file, and a write fault on a full filesystem is SIGBUS.
	fsReserve = 2*16<<20 + 8<<20
	// overlapHashBytes: Put hashes blocks at least this large concurrently
	// with their write.
	overlapHashBytes = 256 << 10
)

// Store is the NVMe tier. It is safe for concurrent use.
type Store struct {
	db     *badger.DB
	lock   *dirLock
	log    *slog.Logger
	dir    string
	opts   Options
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{}

	segs        *segStore
	segFileSize int64
	maxBlock    int64
	// bud is the budget derived from the capacity: set at Open, replaced
	// as a whole by SetCapacity, read without locks.
	bud atomic.Pointer[budget]

	// life: RLock by every operation that touches db, Lock by Close.
	life   sync.RWMutex
	closed bool
	// gate: RLock by every write; Lock by DeleteNS (no Put of the
	// namespace slips in between its snapshot and its tombstones).
	gate    sync.RWMutex
	stripes [nStripes]sync.Mutex

	mu       sync.Mutex // guards idx, penalty, passDone, lateDel
	idx      *index
	penalty  int64
	passDone chan struct{} // closed after each maintenance pass
	// lateDel: blocks deleted while the filesystem had no room to log
	// their tombstones (deletionRoom). They left the index at once (never
	// served again by this process); maintenance and Close write the
	// tombstones once there is room, unless the key was stored again.
	lateDel map[Key]struct{}
	// hidden: blocks a Delete could not remove at once because a write
	// held their stripe (or DeleteNS the gate). Reads treat them as absent
	// from then on, and the deleter goroutine removes them once the lock is
	// free, so that a Delete on a client's ring loop never waits for a
	// write to a slow disk. The value is the Delete's number (delSeq): a
	// Put of the key that locks its stripe after it supersedes it
	// (putChunk). logged: its tombstone is in badger after every record
	// of it committed since, so the deleter writes none of its own.
	hidden  map[Key]hiddenDel
	delSeq  uint64
	delKick chan struct{}
	// tombs: the hidden blocks whose Delete is writing their tombstone
	// (under no lock: a process crash must not undo a Delete that
	// returned). A Put that supersedes the Delete waits for it before its
	// own commit (putChunk); a relocation that raced it writes it again
	// (move).
	tombs map[Key]*tombWait
	// hiddenMax is maxHidden (tests set a smaller bound, before use).
	hiddenMax int
	// testHook, if set (tests only, before use), runs in putChunk with
	// the chunk's stripes locked, before its write ("put"), in the
	// deleter before it takes each hidden block's stripe ("hidden"), and
	// in compaction's move of a block, its stripe locked, before the new
	// record is committed ("move"), and in Delete, once it has hidden a
	// block, before it logs the tombstone ("tomb").
	testHook func(point string)

	measureMu    sync.Mutex // one measure at a time (it subtracts the writtenSince it read)
	diskMeasured atomic.Int64
	fsAvail      atomic.Int64 // free bytes on the filesystem, last measurement
	writtenSince atomic.Int64 // bytes put since the last measurement
	admitted     atomic.Int64 // bytes waitRoom let in whose writes are not in writtenSince yet

	hits, misses, checksumMisses, evictions, puts, noSpace, gcRuns, moved atomic.Uint64

	reindexBlocks   int
	reindexDuration time.Duration
	movedAside      string
}

// budget is what the store derives from its capacity.
type budget struct {
	capacity  int64 // the on-disk budget (CapacityBytes, or SetCapacity's)
	baseLimit int64 // logical limit before the adaptive penalty
	softCap   int64 // measured disk above this: GC harder, shrink the limit
}

// budgetFor derives the budget of capacity C with segment files of
// segFileSize bytes.
func budgetFor(C, segFileSize int64) *budget {
	// Room for: the segments the lanes append to (never collected), one
	// partly dead segment, the badger index (~100 B/block) and small files.
	reserve := (nLanes+1)*segFileSize + C/64 + 4<<20
	// 9C/10 without the 64-bit overflow of C*9 (a capacity may reach
	// MaxInt64).
	b := &budget{capacity: C, baseLimit: min(C-reserve, C/10*9+C%10*9/10), softCap: C - segFileSize/2}
	if b.baseLimit < C/4 {
		b.baseLimit = C / 4
	}
	return b
}

// BlockOverhead is what the byte budget charges per block on top of its
// payload padded to the segments' direct-I/O alignment (see "Byte
// budget"); a payload that is a multiple of it (any multiple of 4 KiB
// is) has no padding.
const BlockOverhead = blockOverhead

// PlanAlign is the direct-I/O alignment a planner assumes for the record
// of a block on disk: 4 KiB, the common one (a filesystem that takes
// 512-byte direct I/O pads less, so the store keeps at least as many).
const PlanAlign = 4096

// LogicalLimitFor is the logical limit of a store opened with the given
// CapacityBytes, before any adaptive penalty: the charged bytes (payload
// plus BlockOverhead per block) it holds before Put evicts. kvtierctl plan
// sizes the NVMe tier with it.
func LogicalLimitFor(capacity int64) int64 {
	return budgetFor(capacity, segFileSizeFor(capacity)).baseLimit
}

func (s *Store) capacity() int64 { return s.bud.Load().capacity }

// SetCapacity changes the on-disk budget of the open store (a
// configuration reload). n must be at least MinCapacity and four segment
// files (the segment file size stays the one computed at Open, so does
// MaxBlockBytes). The logical limit, the soft cap and the room checks of
// Put and GC follow at once. When the budget shrinks, least recently used
// blocks are evicted down to the new logical limit before SetCapacity
// returns and the maintenance loop is woken to give the disk space back
// (compacting segments, and shrinking the limit further while the measured
// usage stays over the soft cap), so the directory goes under the new
// budget within a few maintenance passes. Puts meanwhile may wait for room
// (and fail with ErrNoSpace after a second) as when the store is full.
func (s *Store) SetCapacity(n int64) error {
	if lo := max(MinCapacity, 4*s.segFileSize); n < lo {
		return fmt.Errorf("nvme: capacity %d below minimum %d (MinCapacity and four %d-byte segment files)", n, lo, s.segFileSize)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	s.mu.Lock()
	old, b := s.bud.Load(), budgetFor(n, s.segFileSize)
	s.bud.Store(b)
	s.penalty = min(s.penalty, max(0, b.baseLimit-b.capacity/8)) // as maintain bounds it
	s.mu.Unlock()
	if n < old.capacity {
		s.evictDown()
	}
	s.wake()
	s.log.Info("nvme: capacity changed", "from", old.capacity, "to", n, "logical_limit", s.Stats().LogicalLimit)
	return nil
}

func stripeOf(k Key) int { return int((k.Hash.Lo ^ k.Hash.Hi ^ uint64(k.NS)) % nStripes) }

// segFileSizeFor picks the segment file size: 1/32 of the capacity,
// clamped to [16 MiB, 1 GiB). Smaller files let GC return space in finer
// steps (a file is the unit of reclamation, and the files lanes append to
// are never collected) at the price of more files; 16 MiB still holds an
// 8 MiB block.
func segFileSizeFor(capacity int64) int64 {
	v := capacity / 32
	v = max(v, 16<<20)
	v = min(v, 1<<30-1)
	return v
}

// badgerOptions: badger is only the index (21-byte keys, 48-byte records
// kept inline in the LSM); block payloads never pass through it. With
// payloads in badger's value log (format 1, these options plus
// ValueThreshold = 32) TestRawVsStore measured 2 MiB Put+sync at 17–27% of
// raw O_DIRECT writes on the 2-vCPU development VM (profile: 83% memmove
// into the value log's mmap, i.e. page faults); with payloads in direct-I/O
// segments it measures 72–79% single-stream and 64–78% with 2 writers
// (medians of two 6-round runs; single rounds 51–108%, the disk is noisy),
// cold Get 76–89% and 81–93% (docs/benchmarks.md).
//   - MemTableSize 16 MiB (~150k entries), BaseLevelSize 256 MiB (the
//     whole index in one level up to millions of blocks).
//   - ValueLogFileSize 16 MiB: badger's value log stays unused (records are
//     far below the 1 MiB ValueThreshold), so only its empty head file exists.
//   - NumVersionsToKeep 1, DetectConflicts off (no transactions across
//     keys), Compression None, BlockCacheSize 0 and IndexCacheSize 0
//     (tables are read via mmap), MetricsEnabled false (badger's expvar
//     metrics are process globals).
//   - SyncWrites follows Options.SyncWrites (then segments are fdatasynced
//     after every append too).
func badgerOptions(dir string, o Options, log *slog.Logger) badger.Options {
	bo := badger.DefaultOptions(dir).
		WithLogger(badgerLogger{log}).
		WithSyncWrites(o.SyncWrites).
		WithValueLogFileSize(16 << 20).
		WithMemTableSize(16 << 20).
		WithBaseLevelSize(256 << 20).
		WithNumVersionsToKeep(1).
		WithDetectConflicts(false).
		WithCompression(options.None).
		WithBlockCacheSize(0).
		WithIndexCacheSize(0).
		WithVerifyValueChecksum(false).
		WithNumCompactors(2).
		WithMetricsEnabled(false)
	if o.tune != nil {
		o.tune(&bo)
	}
	return bo
}

// Open opens (or creates) the store in opts.Dir and rebuilds the in-memory
// index from the keys. ctx bounds the open and reindex only; the store's
// background goroutine lives until Close.
//
// If badger cannot open the directory for a reason other than permissions,
// a full/read-only disk or a held lock, the directory is considered corrupt:
// it is renamed to Dir.corrupt-<unix seconds> (older .corrupt-* siblings
// are removed, the newest is kept for inspection), a warning is logged and
// the store starts empty. So is a directory whose MANIFEST no longer lists
// tables holding blocks (see the package doc).
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, errors.New("nvme: Options.Dir is empty")
	}
	if opts.CapacityBytes < MinCapacity {
		return nil, fmt.Errorf("nvme: CapacityBytes %d below minimum %d", opts.CapacityBytes, MinCapacity)
	}
	if opts.GCInterval <= 0 {
		opts.GCInterval = 10 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("tier", "nvme")
	dir := filepath.Clean(opts.Dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, fmt.Errorf("nvme: %w", err)
	}
	lk, err := lockDir(dir + ".lock")
	if err != nil {
		return nil, err
	}
	s := &Store{
		lock: lk, log: log, dir: dir, opts: opts,
		kick:      make(chan struct{}, 1),
		delKick:   make(chan struct{}, 1),
		hiddenMax: maxHidden,
		passDone:  make(chan struct{}),
	}
	s.segFileSize = segFileSizeFor(opts.CapacityBytes)
	s.maxBlock = s.segFileSize - 1<<20
	s.bud.Store(budgetFor(opts.CapacityBytes, s.segFileSize))
	dropOldFormat(dir, log)
	if err := replayRoom(dir); err != nil {
		lk.release()
		return nil, err
	}

	db, err := s.openDB(dir)
	if err != nil && openErrIsCorruption(err) {
		aside := fmt.Sprintf("%s.corrupt-%d", dir, time.Now().Unix())
		log.Warn("nvme store failed to open; moving it aside and starting empty", "dir", dir, "moved_to", aside, "err", err)
		if rerr := os.Rename(dir, aside); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			lk.release()
			return nil, fmt.Errorf("nvme: open failed (%v) and moving aside failed: %w", err, rerr)
		}
		s.movedAside = aside
		pruneCorrupt(dir, aside, log)
		db, err = s.openDB(dir)
	}
	if err != nil {
		lk.release()
		return nil, fmt.Errorf("nvme: open %s: %w", dir, err)
	}
	s.db = db
	if s.segs, err = openSegStore(filepath.Join(dir, segDirName), s.segFileSize, opts.SyncWrites); err != nil {
		db.Close()
		lk.release()
		return nil, fmt.Errorf("nvme: open segments: %w", err)
	}
	if err := s.reindex(ctx); err != nil {
		s.segs.closeAll()
		db.Close()
		lk.release()
		return nil, err
	}
	s.measure()
	lctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(2)
	go s.loop(lctx)
	go s.deleter(lctx)
	// Filled under a larger capacity (a restart with a lower one): as
	// SetCapacity does, evict down to the logical limit now and have the
	// maintenance loop give the disk space back, rather than stay over
	// the budget until a Put or the next period.
	s.evictDown()
	if s.evictions.Load() > 0 || s.diskMeasured.Load() > s.bud.Load().softCap {
		s.wake()
	}
	return s, nil
}

// replayRoom refuses (ErrNoSpace) to open a store whose filesystem has no
// room for what badger's Open writes: the write-ahead logs (*.mem) a
// process that did not close the store left behind are replayed and
// written out as tables, through a shared mapping of a new file, so that
// past the free space badger's Open dies of SIGBUS (at every restart). A
// table takes about what its log does. The directory is left as it is for
// an open once there is room.
func replayRoom(dir string) error {
	var need int64
	mems, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	for _, p := range mems {
		if fi, err := os.Stat(p); err == nil {
			need += allocated(fi)
		}
	}
	if need == 0 {
		return nil
	}
	need += need/8 + walSlack
	if a, ok := fsAvail(dir); ok && a < need {
		return fmt.Errorf("nvme: %w: replaying the index log in %s needs about %d bytes, the filesystem has %d free", ErrNoSpace, dir, need, a)
	}
	return nil
}

// openDB opens badger, converting a panic inside badger into an error.
func (s *Store) openDB(dir string) (db *badger.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("badger panicked during open: %v", r)
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	bo := badgerOptions(dir, s.opts, s.log)
	listed, err := checkTables(dir, bo, s.log)
	if err != nil {
		return nil, err
	}
	// Badger's log of a store not closed: a crash may have left tables
	// the MANIFEST does not list, harmlessly (checkUnlisted).
	mems, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	if listed != nil {
		if err := setAsideUnlisted(dir, listed); err != nil {
			return nil, fmt.Errorf("setting aside the tables the MANIFEST does not list: %w", err)
		}
	}
	db, err = badger.Open(bo)
	if err != nil {
		return nil, err
	}
	if err := checkUnlisted(dir, db, bo, len(mems) > 0, s.log); err != nil {
		db.Close()
		return nil, err
	}
	// Opened in place: a torn tail was a crash's, and is no evidence.
	if err := os.Remove(filepath.Join(dir, tornTailName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("nvme: cannot remove the saved MANIFEST tail", "err", err)
	}
	return db, nil
}

// dropOldFormat empties a directory written by the format-1 store (blocks
// inside badger's value log, no segments directory): it is a cache, and
// its value log could no longer be collected.
func dropOldFormat(dir string, log *slog.Logger) {
	if _, err := os.Stat(filepath.Join(dir, "MANIFEST")); err != nil {
		return
	}
	if _, err := os.Stat(filepath.Join(dir, segDirName)); err == nil {
		return
	}
	log.Warn("nvme: store directory has the old on-disk format; starting empty", "dir", dir)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// openErrIsCorruption says whether a failed open should move the directory
// aside. Environmental failures must not destroy a healthy cache.
func openErrIsCorruption(err error) bool {
	for _, e := range []error{fs.ErrPermission, syscall.ENOSPC, syscall.EROFS, syscall.EDQUOT,
		syscall.EWOULDBLOCK, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, ErrLocked} {
		if errors.Is(err, e) {
			return false
		}
	}
	msg := err.Error()
	return !strings.Contains(msg, "Cannot acquire directory lock") &&
		!strings.Contains(msg, "permission denied") &&
		!strings.Contains(msg, "no space left")
}

// pruneCorrupt removes older dir.corrupt-* siblings, keeping keep.
func pruneCorrupt(dir, keep string, log *slog.Logger) {
	matches, _ := filepath.Glob(dir + ".corrupt-*")
	for _, m := range matches {
		if m == keep {
			continue
		}
		if err := os.RemoveAll(m); err != nil {
			log.Warn("nvme: cannot remove old corrupt store", "dir", m, "err", err)
		}
	}
}

// reindex rebuilds the index from badger (keys and their 48-byte inline
// records; no block data is read). Recency after a restart is the badger
// commit version (write order): the oldest write is evicted first. Reads
// do not rewrite a key, so read recency of the previous run is not
// persisted; in the tier chain a block that is read is promoted and, when
// demoted again, Put anew, which refreshes its version. Records that are
// malformed, point into a missing segment or past a segment's end (a torn
// tail) are deleted. Segments no record points into are removed.
func (s *Store) reindex(ctx context.Context) error {
	start := time.Now()
	type kv struct {
		ver uint64
		seg uint32
		off int64
		i   int32
	}
	x := newIndex(0)
	x.pinned = s.opts.Unevictable
	x.align = s.segs.offAlign
	var order []kv
	var bad [][]byte
	var badSeg uint32 // the largest segment id a dropped record names
	segSize := map[uint32]int64{}
	for _, sg := range s.segs.snapshot() {
		segSize[sg.id] = sg.size.Load()
	}
	live := map[uint32]int64{}
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: false, Prefix: []byte{prefixBlock}})
		defer it.Close()
		n := 0
		for it.Rewind(); it.Valid(); it.Next() {
			if n++; n&0xffff == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			item := it.Item()
			k, ok := decodeKey(item.Key())
			var rec record
			if ok && item.ValueSize() == recordLen {
				if err := item.Value(func(v []byte) error {
					rec, ok = decodeRecord(v)
					return nil
				}); err != nil {
					ok = false
				}
			} else {
				ok = false
			}
			if ok {
				sz, exists := segSize[rec.seg]
				// An empty record occupies no space (its segment, charged
				// nothing, may be removed).
				ok = rec.n <= s.maxBlock && (rec.n == 0 || exists && rec.offset+s.segs.recLen(rec.n) <= sz) // fields ≤ 2^40: no overflow
			}
			if !ok {
				bad = append(bad, item.KeyCopy(nil))
				badSeg = max(badSeg, rec.seg)
				continue
			}
			x.put(k, rec.n, rec.seg, false)
			live[rec.seg] += s.segs.recLen(rec.n)
			i, _ := x.get(k)
			order = append(order, kv{item.Version(), rec.seg, rec.offset, i})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("nvme: reindex: %w", err)
	}
	// Relink in version order: newest at the head. The blocks of one
	// PutBatch chunk share a version (one transaction); their records lie
	// back to back in one segment in the order they were given, which
	// breaks the tie.
	sort.Slice(order, func(a, b int) bool {
		x, y := order[a], order[b]
		return cmp.Or(cmp.Compare(x.ver, y.ver), cmp.Compare(x.seg, y.seg), cmp.Compare(x.off, y.off)) < 0
	})
	x.head, x.tail = nilIdx, nilIdx
	for _, o := range order {
		x.pushFront(o.i)
	}
	if len(bad) > 0 {
		s.log.Warn("nvme: dropping malformed, torn or dangling index records", "count", len(bad))
		// In rounds of as many deletions as the filesystem has room for
		// (deletionRoom, at most maxVictimsPerPut).
		for len(bad) > 0 {
			room := s.deletionRoom()
			if room == 0 {
				// A full filesystem: the rest stay out of the index and
				// are dropped at a later Open; new segments get ids past
				// any they point into, so that none of them comes to lie
				// within a segment.
				s.log.Warn("nvme: filesystem full; keeping some dropped index records until the next open", "count", len(bad))
				s.segs.mu.Lock()
				s.segs.next = max(s.segs.next, badSeg+1)
				s.segs.mu.Unlock()
				break
			}
			round := bad[:min(room, len(bad))]
			wb := s.db.NewWriteBatch()
			for _, k := range round {
				_ = wb.Delete(k)
			}
			_ = wb.Flush()
			bad = bad[len(round):]
		}
	}
	for _, sg := range s.segs.snapshot() {
		sg.live.Store(live[sg.id])
		if live[sg.id] == 0 {
			if err := s.segs.remove(sg.id); err != nil {
				s.log.Warn("nvme: cannot remove unreferenced segment", "segment", sg.id, "err", err)
			}
		}
	}
	s.idx = x
	s.reindexBlocks = x.len()
	s.reindexDuration = time.Since(start)
	s.log.Info("nvme: index rebuilt", "blocks", x.len(), "bytes", x.bytes, "took", s.reindexDuration)
	return nil
}

func (s *Store) enter() error {
	s.life.RLock()
	if s.closed {
		s.life.RUnlock()
		return ErrClosed
	}
	return nil
}

func (s *Store) exit() { s.life.RUnlock() }

// limit is the logical limit. Requires s.mu (penalty).
func (s *Store) limit() int64 {
	b := s.bud.Load()
	return max(b.baseLimit-s.penalty, b.capacity/8)
}

// charge is what the budget charges for a block of size bytes: its
// record on disk (the payload padded to the segments' alignment) and
// blockOverhead.
func (s *Store) charge(size int64) int64 { return s.segs.recLen(size) + blockOverhead }

// chargedLocked is the budget's charge for every indexed block. Requires
// s.mu.
func (s *Store) chargedLocked() int64 {
	return s.idx.bytes + s.idx.padBytes + int64(s.idx.len())*blockOverhead
}

// MaxBlockBytes returns the largest block Put accepts (one segment file
// minus slack).
func (s *Store) MaxBlockBytes() int64 { return s.maxBlock }

// Put stores block under k, replacing any previous block. If the budget
// would be exceeded it first evicts least-recently-used blocks. If the
// measured disk usage is over capacity (GC has not caught up), Put waits up
// to one second for a maintenance pass and then fails with ErrNoSpace.
//
// The payload is written to a segment file before Put returns (with direct
// I/O straight from block when it is aligned for it, else through an
// aligned buffer), then the index record is committed to badger.
func (s *Store) Put(k Key, block []byte) error {
	return s.PutBatch([]Key{k}, [][]byte{block})
}

// putBatchBytes bounds the records PutBatch writes with one write: at
// 64 KiB blocks, single-stream store puts measured 505 MB/s one block per
// write and 1,384 MB/s for 1 MiB writes on the development VM (raw direct
// writes 565 and 1,689 MB/s; docs/benchmarks.md, "Batched NVMe writes").
const putBatchBytes = 1 << 20

// PutBatch stores blocks[i] under keys[i] as Put does, in chunks of about
// putBatchBytes: each chunk is one segment write and one index commit, so
// small blocks cost one I/O per chunk instead of one each. A chunk is
// stored whole or not at all; on error the blocks of earlier chunks are
// stored and the rest are not. Keys must be distinct.
func (s *Store) PutBatch(keys []Key, blocks [][]byte) error {
	_, err := s.PutBatchIf(keys, blocks, nil)
	return err
}

// PutBatchIf is PutBatch storing only the blocks for which keep (if set)
// reports true. keep(i) runs while keys[i] is locked against Delete, just
// before the block would be written: a Delete of keys[i] that returned
// before keep ran finds nothing to remove, and one that begins after it
// waits for the block to be indexed and removes it. A caller writing down
// a copy of a block that may be deleted meanwhile asks keep whether it
// still exists, so that the deleted block never becomes visible here.
//
// It returns how many leading keys are done: their chunks committed, each
// block stored unless keep refused it. On error keys[done:] are not
// stored, and a caller counting what it wrote counts keys[:done].
func (s *Store) PutBatchIf(keys []Key, blocks [][]byte, keep func(i int) bool) (done int, err error) {
	if len(keys) != len(blocks) {
		return 0, fmt.Errorf("nvme: put batch: %d keys, %d blocks", len(keys), len(blocks))
	}
	for i, b := range blocks {
		if size := int64(len(b)); size > s.maxBlock {
			return 0, fmt.Errorf("%w: %d > %d", ErrTooLarge, size, s.maxBlock)
		}
		if slices.Contains(keys[:i], keys[i]) { // batches are small (a writer's run)
			return 0, fmt.Errorf("nvme: put batch: key %v twice", keys[i])
		}
	}
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	for i := 0; i < len(keys); {
		j, n := i+1, s.segs.recLen(int64(len(blocks[i])))
		for ; j < len(keys); j++ {
			rl := s.segs.recLen(int64(len(blocks[j])))
			if n+rl > putBatchBytes {
				break
			}
			n += rl
		}
		var chunkKeep func(int) bool
		if keep != nil {
			base := i
			chunkKeep = func(c int) bool { return keep(base + c) }
		}
		if err := s.putChunk(keys[i:j], blocks[i:j], chunkKeep); err != nil {
			return i, err
		}
		i = j
	}
	return len(keys), nil
}

// putChunk stores one chunk of PutBatch: at most putBatchBytes of records
// (or one block), which fits in one segment. Blocks keep (if set) refuses
// once their stripes are locked are left out.
func (s *Store) putChunk(keys []Key, blocks [][]byte, keep func(i int) bool) error {
	var need int64
	for _, b := range blocks {
		need += s.charge(int64(len(b)))
	}
	if err := s.waitRoom(need); err != nil {
		return err
	}
	defer s.admitted.Add(-need) // counted in writtenSince by then, or not written

	kbs := make([][keyLen]byte, len(keys))
	recs := make([]record, len(keys))
	for i, k := range keys {
		encodeKey(&kbs[i], k)
	}
	// The checksums only read the blocks, as does the direct write, so
	// large chunks are hashed on another goroutine while the write is in
	// flight.
	hash := func() {
		for i, b := range blocks {
			recs[i] = newRecord(&kbs[i], b)
		}
	}
	var hashed chan struct{}
	if need >= overlapHashBytes {
		hashed = make(chan struct{})
		go func() { hash(); close(hashed) }()
	} else {
		hash()
	}

	s.gate.RLock()
	defer s.gate.RUnlock()
	// Stripes in ascending order: two batches never wait on each other in
	// a cycle.
	var held [nStripes]bool
	for _, k := range keys {
		held[stripeOf(k)] = true
	}
	for st := range held {
		if held[st] {
			s.stripes[st].Lock()
			defer s.stripes[st].Unlock()
		}
	}
	// Deletes of these keys up to this one came before this write; later
	// ones came while it holds the stripes, and win.
	// Their tombstones, still being written, must land before this
	// write's records, which would otherwise be deleted in badger (lost
	// at the next Open) while indexed.
	s.mu.Lock()
	startSeq := s.delSeq
	var tombs []chan struct{}
	for _, k := range keys {
		if tw := s.tombs[k]; tw != nil {
			tombs = append(tombs, tw.done)
		}
	}
	s.mu.Unlock()
	for _, done := range tombs {
		<-done
	}
	if s.testHook != nil {
		s.testHook("put")
	}
	if keep != nil {
		if hashed != nil {
			<-hashed
			hashed = nil
		}
		var fk []Key
		var fb [][]byte
		var fkb [][keyLen]byte
		var fr []record
		for i := range keys {
			if keep(i) {
				fk, fb, fkb, fr = append(fk, keys[i]), append(fb, blocks[i]), append(fkb, kbs[i]), append(fr, recs[i])
			}
		}
		if len(fk) == 0 {
			return nil
		}
		if len(fk) < len(keys) {
			keys, blocks, kbs, recs = fk, fb, fkb, fr
			need = 0
			for _, b := range blocks {
				need += s.charge(int64(len(b)))
			}
		}
	}

	type prior struct {
		size int64 // -1: none
		seg  uint32
	}
	olds := make([]prior, len(keys))
	s.mu.Lock()
	over := s.chargedLocked() + need - s.limit()
	for i, k := range keys {
		olds[i] = prior{size: -1}
		if j, ok := s.idx.get(k); ok {
			olds[i] = prior{s.idx.ents[j].size, s.idx.ents[j].seg}
			over -= s.charge(olds[i].size)
		}
	}
	victims, pinned := s.pickVictimsLocked(over, maxVictimsPerPut, func(k Key) bool { return slices.Contains(keys, k) }, &held)
	if pinned {
		// Unevictable blocks fill the budget: refuse, evicting nothing.
		for j := len(victims) - 1; j >= 0; j-- {
			s.idx.put(victims[j].key, victims[j].size, victims[j].seg, true)
		}
		s.mu.Unlock()
		s.unlockVictims(victims, &held)
		if hashed != nil {
			<-hashed
		}
		s.noSpace.Add(1)
		return fmt.Errorf("%w: unevictable blocks fill the budget", ErrNoSpace)
	}
	s.mu.Unlock()

	offs := make([]int64, len(keys))
	seg, err := s.segs.appendMany(blocks, offs)
	if hashed != nil {
		<-hashed
	}
	if err == nil {
		err = s.db.Update(func(txn *badger.Txn) error {
			for _, v := range victims {
				var vb [keyLen]byte
				encodeKey(&vb, v.key)
				if err := txn.Delete(vb[:]); err != nil {
					return err
				}
			}
			var rb [recordLen]byte
			for i := range keys {
				recs[i].seg, recs[i].offset = seg, offs[i]
				recs[i].encode(&rb)
				if err := txn.SetEntry(badger.NewEntry(kbs[i][:], bytes.Clone(rb[:]))); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			for _, b := range blocks {
				s.segs.release(seg, int64(len(b)), true)
			}
		}
	}
	var relog []Key
	var relogWaits []chan struct{}
	s.mu.Lock()
	if err != nil {
		// Nothing was indexed: the victims are still on disk, put them back
		// as the coldest entries.
		for _, v := range victims {
			if _, ok := s.idx.get(v.key); !ok {
				s.idx.put(v.key, v.size, v.seg, true)
			}
		}
	} else {
		for i, k := range keys {
			s.idx.put(k, int64(len(blocks[i])), seg, false)
			if h, ok := s.hidden[k]; ok && h.seq <= startSeq {
				// Deleted while another write held the stripe, before
				// this write of k began: this block is newer than the
				// deletion, which must not remove it.
				delete(s.hidden, k)
			} else if ok {
				// Deleted while this write held the stripe: the
				// Delete wins, and its tombstone may have landed
				// before this record.
				relog = append(relog, k)
				s.markLoggedLocked(k, false)
				if tw := s.tombs[k]; tw != nil {
					relogWaits = append(relogWaits, tw.done)
				}
			}
		}
	}
	s.mu.Unlock()
	s.relogDeletes(relog, relogWaits)
	s.unlockVictims(victims, &held)
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			s.noSpace.Add(1)
			return fmt.Errorf("%w: %w", ErrNoSpace, err)
		}
		return fmt.Errorf("nvme: put: %w", err)
	}
	wake := false
	for i, b := range blocks {
		s.segs.commit(seg)
		s.writtenSince.Add(s.segs.recLen(int64(len(b))) + blockOverhead)
		if olds[i].size >= 0 {
			wake = s.segs.release(olds[i].seg, olds[i].size, false) || wake
		}
	}
	s.puts.Add(uint64(len(keys)))
	for _, v := range victims {
		wake = s.segs.release(v.seg, v.size, false) || wake
	}
	s.evictions.Add(uint64(len(victims)))
	if wake {
		s.wake()
	}
	return nil
}

type victim struct {
	key    Key
	size   int64
	seg    uint32
	stripe int
}

// pickVictimsLocked removes LRU entries totalling at least over bytes
// (charged), at most maxVictims of them, from the index and returns them
// with their stripes locked
// (except those in held, which the caller holds; held may be nil). Entries
// for which exclude reports true (the keys being written) and entries
// whose stripe is busy (someone is writing or deleting them right now)
// are skipped. pinned reports that evicting every other evictable entry
// would still leave the total over by the charge of Unevictable entries
// (they fill the budget). Requires s.mu.
func (s *Store) pickVictimsLocked(over int64, maxVictims int, exclude func(Key) bool, held *[nStripes]bool) (vs []victim, pinned bool) {
	if over <= 0 {
		return nil, false
	}
	var locked [nStripes]bool
	busy, unevictable := false, false
	i := s.idx.tail
	for ; i != nilIdx && over > 0 && len(vs) < maxVictims; i = s.idx.ents[i].prev {
		e := s.idx.ents[i]
		if exclude != nil && exclude(e.key) {
			continue
		}
		if s.opts.Unevictable != nil && s.opts.Unevictable(e.key) {
			unevictable = true
			continue
		}
		st := stripeOf(e.key)
		ok := (held != nil && held[st]) || locked[st]
		if !ok && s.stripes[st].TryLock() {
			locked[st], ok = true, true
		}
		if ok {
			vs = append(vs, victim{e.key, e.size, e.seg, st})
			over -= s.charge(e.size)
		} else {
			busy = true
		}
	}
	for _, v := range vs {
		s.idx.remove(v.key)
	}
	return vs, over > 0 && i == nilIdx && unevictable && !busy
}

// unlockVictims unlocks the stripes pickVictimsLocked locked.
func (s *Store) unlockVictims(vs []victim, held *[nStripes]bool) {
	var done [nStripes]bool
	for _, v := range vs {
		if (held == nil || !held[v.stripe]) && !done[v.stripe] {
			done[v.stripe] = true
			s.stripes[v.stripe].Unlock()
		}
	}
}

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// waitRoom blocks (≤1s) while the estimated disk usage plus n is over
// capacity, or n would eat into fsReserve, waking the maintenance loop.
func (s *Store) waitRoom(n int64) error {
	deadline := time.Now().Add(time.Second)
	for {
		// Reserve n first: concurrent callers each see the others'
		// admitted bytes (their writes reach writtenSince only later).
		a := s.admitted.Add(n)
		w := s.writtenSince.Load() + a
		est := s.diskMeasured.Load() + w
		if w > s.fsAvail.Load()-fsReserve {
			s.admitted.Add(-n)
			// The filesystem, not the budget, is full: waiting for GC would
			// stall the caller for nothing. Look again once, then refuse.
			if s.measure(); s.writtenSince.Load()+s.admitted.Load()+n > s.fsAvail.Load()-fsReserve {
				s.noSpace.Add(1)
				s.wake()
				return fmt.Errorf("%w: filesystem has %d bytes free, %d kept in reserve", ErrNoSpace, s.fsAvail.Load(), int64(fsReserve))
			}
			continue
		}
		// Headroom: badger's files (memtable WAL, tables) grow between
		// measurements by more than the per-block charge accounts for.
		capacity := s.capacity()
		if est <= capacity-min(s.segFileSize/4, capacity/32) {
			return nil // the caller gives back n from admitted
		}
		s.admitted.Add(-n)
		est -= n
		left := time.Until(deadline)
		if left <= 0 {
			s.noSpace.Add(1)
			return fmt.Errorf("%w: estimated %d + %d > %d", ErrNoSpace, est, n, capacity)
		}
		s.mu.Lock()
		ch := s.passDone
		s.mu.Unlock()
		s.wake()
		t := time.NewTimer(left)
		select {
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

// Get copies the block into dst and returns its length. The block is
// verified (length and XXH3-128 over key, header and payload) after it has
// been copied; on mismatch the key is deleted and Get returns an error
// matching both ErrNotFound and ErrChecksum. If dst is too small it returns
// (size, ErrShortBuffer). On error the contents of dst are unspecified.
func (s *Store) Get(k Key, dst []byte) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	s.mu.Lock()
	i, ok := s.idx.get(k)
	if !ok || s.isHiddenLocked(k) {
		s.mu.Unlock()
		s.misses.Add(1)
		return 0, ErrNotFound
	}
	size := s.idx.ents[i].size
	s.idx.touch(i)
	s.mu.Unlock()
	if int64(len(dst)) < size {
		return int(size), ErrShortBuffer
	}

	var kb [keyLen]byte
	encodeKey(&kb, k)
	for attempt := 0; ; attempt++ {
		var (
			rec  record
			ok   bool
			ver  uint64
			derr error
		)
		err := s.db.View(func(txn *badger.Txn) error {
			item, err := txn.Get(kb[:])
			if err != nil {
				return err
			}
			ver = item.Version()
			return item.Value(func(v []byte) error {
				rec, ok = decodeRecord(v)
				return nil
			})
		})
		switch {
		case errors.Is(err, badger.ErrKeyNotFound):
			s.dropMissing(k, kb)
			s.misses.Add(1)
			return 0, ErrNotFound
		case errors.Is(err, badger.ErrDBClosed):
			return 0, ErrClosed
		case err != nil:
			derr = err
		case !ok:
			derr = errors.New("malformed index record")
		case rec.n > int64(len(dst)):
			// Only a record that lies within its segment may say how large
			// the block is: a corrupt one would charge the budget with its
			// length.
			if derr = s.segs.check(rec.seg, rec.offset, rec.n); derr != nil {
				if errors.Is(derr, errSegmentGone) && attempt < 3 {
					continue
				}
				break
			}
			// The index said less: a Put of k is between its badger
			// commit and its index update, which it makes itself.
			return int(rec.n), ErrShortBuffer
		default:
			derr = s.segs.read(rec.seg, rec.offset, rec.n, dst)
			if errors.Is(derr, errSegmentGone) && attempt < 3 {
				continue // relocated by compaction meanwhile: look again
			}
			if derr == nil && !rec.verify(&kb, dst[:rec.n]) {
				derr = errors.New("checksum mismatch")
			}
		}
		if derr != nil {
			s.checksumMisses.Add(1)
			s.misses.Add(1)
			s.log.Warn("nvme: block failed verification; deleting it", "ns", k.NS, "hash_hi", k.Hash.Hi, "hash_lo", k.Hash.Lo, "err", derr)
			s.dropCorrupt(k, kb, ver)
			return 0, fmt.Errorf("%w (%w)", ErrNotFound, ErrChecksum)
		}
		n := int(rec.n)
		s.hits.Add(1)
		return n, nil
	}
}

// dropMissing removes k from the index if badger has no record of it.
// Under k's stripe: no Put or Delete of k is between its badger commit and
// its index update, so the index entry seen is the one the lookup missed.
func (s *Store) dropMissing(k Key, kb [keyLen]byte) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	st := stripeOf(k)
	s.stripes[st].Lock()
	defer s.stripes[st].Unlock()
	err := s.db.View(func(txn *badger.Txn) error {
		_, err := txn.Get(kb[:])
		return err
	})
	if !errors.Is(err, badger.ErrKeyNotFound) {
		return
	}
	s.mu.Lock()
	sz, seg := s.idx.remove(k)
	s.mu.Unlock()
	if sz >= 0 && s.segs.release(seg, sz, false) {
		s.wake()
	}
}

// dropCorrupt deletes k if it still holds the version that failed.
func (s *Store) dropCorrupt(k Key, kb [keyLen]byte, ver uint64) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	st := stripeOf(k)
	s.stripes[st].Lock()
	defer s.stripes[st].Unlock()
	same := true
	if ver != 0 {
		_ = s.db.View(func(txn *badger.Txn) error {
			item, err := txn.Get(kb[:])
			same = err != nil || item.Version() == ver
			return nil
		})
	}
	if !same {
		return // rewritten meanwhile
	}
	if s.deletionRoom() == 0 {
		// No room to log the deletion (see deletionRoom): the record stays
		// in badger, out of the index; a later Open indexes it again, and
		// its Get fails again (a miss).
		s.log.Warn("nvme: filesystem full; corrupt block's record kept until the next open", "ns", k.NS)
	} else if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(kb[:]) }); err != nil {
		s.log.Warn("nvme: delete of corrupt block failed", "err", err)
	}
	s.mu.Lock()
	sz, seg := s.idx.remove(k)
	s.mu.Unlock()
	if sz >= 0 && s.segs.release(seg, sz, false) {
		s.wake()
	}
}

// Contains reports whether k is in the index. No I/O.
func (s *Store) Contains(k Key) bool {
	s.mu.Lock()
	_, ok := s.idx.get(k)
	ok = ok && !s.isHiddenLocked(k)
	s.mu.Unlock()
	return ok
}

// Size returns the size of k's block from the index (no I/O).
func (s *Store) Size(k Key) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.idx.get(k); ok && !s.isHiddenLocked(k) {
		return s.idx.ents[i].size, true
	}
	return 0, false
}

// Delete removes k. Deleting an absent key is not an error. It does not
// wait for writes of other blocks: when a Put holds k's stripe (or
// DeleteNS the store), k is hidden at once (Get, Contains, Size and Keys no
// longer see it) and the deleter goroutine removes it when the lock is free
// (or Close does), unless a Put of k that began after the Delete stored it
// again. Its tombstone is logged before Delete returns either way, so a
// process crash does not bring the block back (TestHiddenDeleteSurvivesACrash);
// a restart does find a block whose deletion the filesystem had no room to
// log: when it has none, k leaves the index (or is hidden) at once and its
// tombstone is written once there is room (lateDel).
func (s *Store) Delete(k Key) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	st := stripeOf(k)
	if s.gate.TryRLock() {
		if s.stripes[st].TryLock() {
			err := s.deleteLocked(k)
			s.stripes[st].Unlock()
			s.gate.RUnlock()
			return err
		}
		s.gate.RUnlock()
	}
	s.mu.Lock()
	if len(s.hidden) >= s.hiddenMax {
		// The deleter is that far behind (a client deleting in a loop
		// while DeleteNS holds the store): wait, as a bound on memory.
		s.mu.Unlock()
		s.gate.RLock()
		defer s.gate.RUnlock()
		s.stripes[st].Lock()
		defer s.stripes[st].Unlock()
		return s.deleteLocked(k)
	}
	if s.hidden == nil {
		s.hidden = map[Key]hiddenDel{}
	}
	s.delSeq++
	s.hidden[k] = hiddenDel{seq: s.delSeq}
	// Only a stored block has a record to delete; one whose own write holds
	// the stripe logs the tombstone again after its commit (relogDeletes).
	_, stored := s.idx.get(k)
	var tw *tombWait
	if stored {
		if tw = s.tombs[k]; tw == nil {
			if s.tombs == nil {
				s.tombs = map[Key]*tombWait{}
			}
			tw = &tombWait{done: make(chan struct{})}
			s.tombs[k] = tw
		}
		tw.n++
	}
	s.mu.Unlock()
	if tw != nil {
		if s.testHook != nil {
			s.testHook("tomb")
		}
		// The tombstone now, so that a process crash before the deleter
		// runs does not bring the block back (hidden is memory only); the
		// deleter takes it out of the index. Without room to log it, the
		// deleter logs it later (lateDel).
		logged := false
		if s.deletionRoom() > 0 {
			var kb [keyLen]byte
			encodeKey(&kb, k)
			if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(kb[:]) }); err != nil {
				s.log.Warn("nvme: logging a hidden block's deletion failed; the deleter logs it", "ns", k.NS, "err", err)
			} else {
				logged = true
			}
		}
		s.mu.Lock()
		if logged {
			// A write holding the stripe that commits k's record after
			// this tombstone sets it back (relogDeletes), under the
			// stripe the deleter waits for.
			s.markLoggedLocked(k, true)
		}
		if tw.n--; tw.n == 0 {
			close(tw.done)
			delete(s.tombs, k)
		}
		s.mu.Unlock()
	}
	select {
	case s.delKick <- struct{}{}:
	default:
	}
	return nil
}

// maxHidden bounds the deletions Delete leaves to the deleter (about
// 60 bytes each).
const maxHidden = 1 << 16

// hiddenDel is a Delete that hid its block (Store.hidden).
type hiddenDel struct {
	seq    uint64 // the Delete's number (delSeq)
	logged bool   // its tombstone is in badger after the block's last record
}

// markLoggedLocked notes whether k's hiding Delete has its tombstone in
// badger after k's last record, if k is hidden. Requires s.mu.
func (s *Store) markLoggedLocked(k Key, logged bool) {
	if h, ok := s.hidden[k]; ok {
		h.logged = logged
		s.hidden[k] = h
	}
}

// relogDeletes logs again the tombstones of keys a Delete hid while the
// caller, holding their stripes, committed new records for them (a Put
// that began before the Delete, a compaction move): the Delete's own
// tombstone may have landed first, and a crash before the deleter runs
// would then bring the blocks back. waits are those Deletes' tombstone
// writes still in flight. A Delete that hides one of the keys after this
// logs its tombstone after the caller's commit. It notes whether the keys'
// deletions are logged (hiddenDel.logged) after the waits, so that a
// Delete's mark set after the caller's commit does not stand: the deleter,
// which needs the stripes the caller holds, then logs only those that are
// not.
func (s *Store) relogDeletes(keys []Key, waits []chan struct{}) {
	for _, w := range waits {
		<-w
	}
	if len(keys) == 0 {
		return
	}
	logged := false
	defer func() {
		s.mu.Lock()
		for _, k := range keys {
			s.markLoggedLocked(k, logged)
		}
		s.mu.Unlock()
	}()
	if s.deletionRoom() == 0 {
		return // no room: the deleter deletes them (lateDel)
	}
	err := s.db.Update(func(txn *badger.Txn) error {
		for _, k := range keys {
			var kb [keyLen]byte
			encodeKey(&kb, k)
			if err := txn.Delete(kb[:]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("nvme: logging the deletion of blocks hidden during a write failed; the deleter logs it", "blocks", len(keys), "err", err)
		return
	}
	logged = true
}

// tombWait counts the Deletes writing a hidden key's tombstone; done is
// closed when the last has.
type tombWait struct {
	n    int
	done chan struct{}
}

// deleteLocked deletes k and ends its hiding, if any. Requires the gate
// (read) and k's stripe.
func (s *Store) deleteLocked(k Key) error {
	s.mu.Lock()
	_, ok := s.idx.get(k)
	if !ok {
		delete(s.hidden, k)
	}
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if s.deletionRoom() == 0 {
		// No room to log the tombstone: the block leaves the index now
		// and its tombstone is written later (lateDel).
		s.deleteLate([]Key{k})
		s.mu.Lock()
		delete(s.hidden, k)
		s.mu.Unlock()
		return nil
	}
	var kb [keyLen]byte
	encodeKey(&kb, k)
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(kb[:]) }); err != nil {
		return fmt.Errorf("nvme: delete: %w", err)
	}
	s.mu.Lock()
	sz, seg := s.idx.remove(k)
	delete(s.hidden, k)
	s.mu.Unlock()
	if sz >= 0 && s.segs.release(seg, sz, false) {
		s.wake()
	}
	return nil
}

// deleter is the goroutine that removes the blocks Delete hid, once their
// stripes are free.
func (s *Store) deleter(ctx context.Context) {
	defer s.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.delKick:
		}
		s.deleteHidden(ctx)
	}
}

// deleteHidden removes the blocks Delete hid, waiting for their stripes,
// until ctx is done. A block badger fails to delete leaves the index
// without its tombstone (deleteLate, as on a full filesystem): as far as
// its caller knows it was deleted. Close runs it once more after the
// deleter has stopped.
func (s *Store) deleteHidden(ctx context.Context) {
	type pending struct {
		k   Key
		seq uint64
	}
	s.mu.Lock()
	todo := make([]pending, 0, len(s.hidden))
	for k, h := range s.hidden {
		todo = append(todo, pending{k, h.seq})
	}
	s.mu.Unlock()
	for _, p := range todo {
		if ctx.Err() != nil {
			return
		}
		if s.testHook != nil {
			s.testHook("hidden")
		}
		st := stripeOf(p.k)
		s.gate.RLock()
		s.stripes[st].Lock()
		s.mu.Lock()
		h, ok := s.hidden[p.k]
		if ok && h.seq == p.seq && h.logged {
			// Its tombstone is in badger already (the Delete's, or the
			// relog of a write that held the stripe): it only leaves the
			// index.
			sz, seg := s.idx.remove(p.k)
			delete(s.hidden, p.k)
			s.mu.Unlock()
			if sz >= 0 && s.segs.release(seg, sz, false) {
				s.wake()
			}
		} else {
			s.mu.Unlock()
		}
		// Another Delete since (a larger seq) is handled in the next
		// round; a Put that superseded it ended the hiding.
		if ok && h.seq == p.seq && !h.logged {
			if err := s.deleteLocked(p.k); err != nil {
				s.log.Warn("nvme: deleting a hidden block failed; its tombstone is written later", "ns", p.k.NS, "err", err)
				s.deleteLate([]Key{p.k})
				s.mu.Lock()
				delete(s.hidden, p.k)
				s.mu.Unlock()
			}
		}
		s.stripes[st].Unlock()
		s.gate.RUnlock()
	}
}

// isHiddenLocked reports whether a Delete hid k. Requires s.mu.
func (s *Store) isHiddenLocked(k Key) bool {
	if len(s.hidden) == 0 {
		return false
	}
	_, ok := s.hidden[k]
	return ok
}

// DeleteNS removes every block of namespace ns and returns how many were in
// the index (not counting those a Delete hid already). It writes one tombstone per block (a WriteBatch per round of
// as many as the filesystem has room for; with none left the rest leave
// the index at once and get their tombstones later, as in Delete) while
// writes to the store are paused, then wakes the maintenance loop, which flushes
// removes the segments that became empty and compacts partly dead ones.
func (s *Store) DeleteNS(ns uint32) (int, error) {
	return s.deleteWhere(func(n uint32) bool { return n == ns }, fmt.Sprintf("namespace %d", ns))
}

// DeleteNamespaces is DeleteNS of every namespace in nss at once, with one
// walk of the index under the store's lock: a DeleteNS per namespace walks
// it once each, which for an evict of everything (up to 65,536 namespaces
// registered) came to minutes of walks, every read waiting between them.
func (s *Store) DeleteNamespaces(nss map[uint32]struct{}) (int, error) {
	return s.deleteWhere(func(n uint32) bool { _, ok := nss[n]; return ok }, fmt.Sprintf("%d namespaces", len(nss)))
}

// deleteWhere is DeleteNS of the namespaces match reports; what names
// them in errors.
func (s *Store) deleteWhere(match func(ns uint32) bool, what string) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	s.gate.Lock()
	defer s.gate.Unlock()
	var keys []Key
	s.mu.Lock()
	hidden := 0 // deleted already, as far as callers know
	s.idx.walk(func(k Key, size int64) bool {
		if match(k.NS) {
			keys = append(keys, k)
			if s.isHiddenLocked(k) {
				hidden++
			}
		}
		return true
	})
	s.mu.Unlock()
	// In rounds of as many tombstones as the filesystem has room for
	// (deletionRoom).
	deleted := 0
	defer func() {
		if deleted > 0 {
			s.wake()
		}
	}()
	for len(keys) > 0 {
		room := s.deletionRoom()
		if room == 0 {
			s.deleteLate(keys) // tombstones written once there is room
			deleted += len(keys)
			break
		}
		round := keys[:min(room, len(keys))]
		wb := s.db.NewWriteBatch()
		for _, k := range round {
			var kb [keyLen]byte
			encodeKey(&kb, k)
			if err := wb.Delete(kb[:]); err != nil {
				wb.Cancel()
				return max(deleted-hidden, 0), fmt.Errorf("nvme: delete %s: %w", what, err)
			}
		}
		if err := wb.Flush(); err != nil {
			return max(deleted-hidden, 0), fmt.Errorf("nvme: delete %s: %w", what, err)
		}
		s.mu.Lock()
		for _, k := range round {
			if sz, seg := s.idx.remove(k); sz >= 0 {
				s.segs.release(seg, sz, false)
			}
		}
		s.mu.Unlock()
		deleted += len(round)
		keys = keys[len(round):]
	}
	return max(deleted-hidden, 0), nil
}

// deleteLate takes keys out of the index without their tombstones, which
// writeLateDeletes writes once the filesystem has room. The caller holds
// the keys' stripes (or the gate).
func (s *Store) deleteLate(keys []Key) {
	released := false
	s.mu.Lock()
	if s.lateDel == nil {
		s.lateDel = map[Key]struct{}{}
	}
	for _, k := range keys {
		if sz, seg := s.idx.remove(k); sz >= 0 {
			released = s.segs.release(seg, sz, false) || released
			s.lateDel[k] = struct{}{}
		}
	}
	n := len(s.lateDel)
	s.mu.Unlock()
	s.log.Warn("nvme: filesystem full; blocks deleted now, their index tombstones written once there is room",
		"blocks", len(keys), "pending", n)
	if released {
		s.wake()
	}
}

// writeLateDeletes writes the tombstones deleteLate left for later, as
// many as the filesystem has room for, in rounds of at most
// maxVictimsPerPut (deletionRoom). A key stored again meanwhile has a new
// record and needs none.
func (s *Store) writeLateDeletes() {
	for s.writeLateDeletesRound() {
	}
}

// writeLateDeletesRound writes one round of late tombstones and reports
// whether another may follow (it made progress and some are left).
func (s *Store) writeLateDeletesRound() bool {
	s.mu.Lock()
	n := len(s.lateDel)
	s.mu.Unlock()
	if n == 0 {
		return false
	}
	room := s.deletionRoom()
	if room == 0 {
		return false
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	s.mu.Lock()
	keys := make([]Key, 0, min(room, n))
	for k := range s.lateDel {
		if len(keys) == room {
			break
		}
		keys = append(keys, k)
	}
	s.mu.Unlock()
	written := 0
	for _, k := range keys {
		st := stripeOf(k)
		s.stripes[st].Lock()
		s.mu.Lock()
		_, stored := s.idx.get(k)
		_, pending := s.lateDel[k]
		delete(s.lateDel, k)
		s.mu.Unlock()
		if pending && !stored {
			var kb [keyLen]byte
			encodeKey(&kb, k)
			if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(kb[:]) }); err != nil {
				s.mu.Lock()
				s.lateDel[k] = struct{}{}
				s.mu.Unlock()
				s.stripes[st].Unlock()
				s.log.Warn("nvme: writing a late tombstone failed; retried at the next pass", "err", err)
				return false
			}
			written++
		}
		s.stripes[st].Unlock()
	}
	s.log.Info("nvme: late index tombstones written", "blocks", written, "pending", n-len(keys))
	return len(keys) > 0 && n > len(keys)
}

// Keys calls fn for every block in the index, from least to most recently
// used, until fn returns false. It iterates a snapshot, so fn may call the
// store.
func (s *Store) Keys(fn func(k Key, size int64) bool) {
	type ks struct {
		k Key
		n int64
	}
	s.mu.Lock()
	snap := make([]ks, 0, s.idx.len())
	s.idx.walk(func(k Key, n int64) bool {
		if !s.isHiddenLocked(k) {
			snap = append(snap, ks{k, n})
		}
		return true
	})
	s.mu.Unlock()
	for _, e := range snap {
		if !fn(e.k, e.n) {
			return
		}
	}
}

// Namespaces calls fn with the namespace of every block in the index
// (those a Delete hid too: they are not gone yet), at least once each. It
// walks the index under the store's lock, without copying it as Keys does
// (fn must not call the store).
func (s *Store) Namespaces(fn func(ns uint32)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first, last := true, uint32(0)
	s.idx.walk(func(k Key, _ int64) bool {
		if first || k.NS != last { // a namespace's blocks often lie in runs
			fn(k.NS)
			first, last = false, k.NS
		}
		return true
	})
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	st := Stats{Blocks: s.idx.len(), Bytes: s.idx.bytes, UnevictableBytes: s.idx.pinnedBytes, LogicalLimit: s.limit(), IndexWalks: s.idx.walks}
	for k := range s.hidden {
		// Deleted as far as callers know (its deleter waits for a lock).
		if i, ok := s.idx.get(k); ok {
			st.Blocks--
			st.Bytes -= s.idx.ents[i].size
			if s.idx.pinned != nil && s.idx.pinned(k) {
				st.UnevictableBytes -= s.idx.ents[i].size
			}
		}
	}
	s.mu.Unlock()
	st.DiskBytes = s.diskMeasured.Load()
	st.Capacity = s.capacity()
	st.Hits, st.Misses = s.hits.Load(), s.misses.Load()
	st.ChecksumMisses = s.checksumMisses.Load()
	st.Evictions, st.Puts, st.NoSpace = s.evictions.Load(), s.puts.Load(), s.noSpace.Load()
	st.GCRuns, st.Relocated = s.gcRuns.Load(), s.moved.Load()
	st.SegmentWrites = s.segs.writes.Load()
	st.SegmentReads = s.segs.reads.Load()
	st.ReindexBlocks, st.ReindexDuration = s.reindexBlocks, s.reindexDuration
	st.MovedAside = s.movedAside
	return st
}

// LogicalBudget is how many logical bytes (payloads plus a per-block
// charge) the on-disk budget holds, before the adaptive penalty that a
// disk fuller than expected applies: what blocks can fill.
func (s *Store) LogicalBudget() int64 { return s.bud.Load().baseLimit }

// UnevictableBytes is Stats().UnevictableBytes without the rest: cheap
// enough for a check per Put (blocks a Delete is hiding still count).
func (s *Store) UnevictableBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idx.pinnedBytes
}

// Close stops the maintenance goroutine, waits for operations in flight,
// and closes badger (which stops all of badger's goroutines). Safe to call
// more than once.
func (s *Store) Close() error {
	s.life.Lock()
	if s.closed {
		s.life.Unlock()
		return nil
	}
	s.closed = true
	s.life.Unlock()
	s.cancel()
	s.wg.Wait()
	// What the deleter left, and the tombstones still to write: a restart
	// would otherwise find those blocks again.
	s.deleteHidden(context.Background())
	s.writeLateDeletes()
	err := s.segs.sync() // data before the index records that point at it
	if derr := s.db.Close(); err == nil {
		err = derr
	}
	if serr := s.segs.closeAll(); err == nil {
		err = serr
	}
	if lerr := s.lock.release(); err == nil {
		err = lerr
	}
	return err
}

// Sync makes every block Put so far durable: it fdatasyncs the segment
// files written since the last Sync, then syncs badger (WAL of the index
// records). Without it a Put survives a crash of the process, not of the
// machine (see Options.SyncWrites).
func (s *Store) Sync() error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	if err := s.segs.sync(); err != nil {
		return fmt.Errorf("nvme: sync: %w", err)
	}
	return s.db.Sync()
}
