package nvme

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
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
	// Must be at least MinCapacity.
	CapacityBytes int64
	// Logger receives warnings (corruption, move-aside) and badger's logs.
	// Nil means slog.Default().
	Logger *slog.Logger
	// SyncWrites makes every Put fsync (msync) the value log before it
	// returns. Default false: a Put is then durable against a process crash
	// (the data is in the page cache, and the kernel writes it back) but
	// not against power loss or a kernel crash; after such a loss the last
	// blocks are misses, never wrong bytes, because every read is verified.
	// For a cache that trade is right: true costs an fsync per Put and, on
	// the development machine, cuts Put throughput several-fold (see
	// BenchmarkOptionSets).
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
	Blocks          int   // blocks in the index
	Bytes           int64 // logical bytes (payload sizes) in the index
	DiskBytes       int64 // allocated bytes of the directory (LSM + value log + manifest/WAL), last measurement
	Capacity        int64
	LogicalLimit    int64 // current eviction threshold for logical bytes (+per-block overhead)
	Hits, Misses    uint64
	ChecksumMisses  uint64 // reads that failed verification (also counted in Misses)
	Evictions       uint64 // blocks removed to stay under the budget
	Puts            uint64
	NoSpace         uint64 // Puts rejected with ErrNoSpace
	GCRuns          uint64 // value-log files rewritten/removed by GC
	LSMFlushes      uint64 // forced memtable flushes (to publish discard stats)
	ReindexBlocks   int
	ReindexDuration time.Duration
	MovedAside      string // non-empty if Open found the directory corrupt and moved it here
}

const (
	nStripes = 64
	// blockOverhead is charged per block on top of its payload: our header
	// (32), badger's value-log entry (key+ts 29, varint header ≤ 8, crc 4),
	// and the LSM entry (key, value pointer, index and bloom share), rounded up.
	blockOverhead    = 192
	maxVictimsPerPut = 8192
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

	vlogFileSize int64
	maxBlock     int64
	flushBytes   int64 // pending deleted bytes that trigger a forced LSM flush
	baseLimit    int64 // logical limit before the adaptive penalty
	softCap      int64 // measured disk above this: GC harder, shrink the limit

	// life: RLock by every operation that touches db, Lock by Close.
	life   sync.RWMutex
	closed bool
	// gate: RLock by every badger write; Lock by DeleteNS and forced
	// flushes (badger's DropPrefix fails concurrent writes).
	gate    sync.RWMutex
	stripes [nStripes]sync.Mutex

	mu       sync.Mutex // guards idx, penalty, passDone
	idx      *index
	penalty  int64
	passDone chan struct{} // closed after each maintenance pass

	diskMeasured   atomic.Int64
	writtenSince   atomic.Int64 // bytes put since the last measurement
	pendingGarbage atomic.Int64 // bytes deleted since the last LSM flush
	lastFlush      atomic.Int64 // unix nanos

	hits, misses, checksumMisses, evictions, puts, noSpace, gcRuns, flushes atomic.Uint64

	reindexBlocks   int
	reindexDuration time.Duration
	movedAside      string
}

func stripeOf(k Key) int { return int((k.Hash.Lo ^ k.Hash.Hi ^ uint64(k.NS)) % nStripes) }

// vlogFileSizeFor picks the value-log file size: 1/32 of the capacity,
// clamped to [16 MiB, 1 GiB). Smaller files let GC return space in finer
// steps (a file is the unit of reclamation, and the head file can never be
// collected) at the price of more files; 16 MiB still holds an 8 MiB block.
func vlogFileSizeFor(capacity int64) int64 {
	v := capacity / 32
	v = max(v, 16<<20)
	v = min(v, 1<<30-1)
	return v
}

// badgerOptions are chosen for 64 KiB–8 MiB values that do not compress.
// TestOptionSets (-nvme.optbench) on the 2-core development VM, two runs,
// 4 writers/readers, put time includes a final db.Sync, cold reads after
// closing and dropping the files' page cache (the VM's disk is noisy: raw
// O_DIRECT write 2.0–2.5 GB/s, read 1.0–1.25 GB/s):
//
//	2 MiB blocks, 1 GiB    put+sync MB/s   cold get MB/s
//	  these options        734–1148        802–1939
//	  + SyncWrites         147–542         —
//	  badger defaults      544–736         1831–1871
//	64 KiB blocks, 256 MiB
//	  these options        446–636         1193–1973
//	  + SyncWrites         45–120          —
//	  badger defaults      254–378         266–599
//
// The big differences are the value threshold for small blocks (defaults
// keep 64 KiB blocks in the LSM: 2–4× slower reads, compaction churn) and
// SyncWrites (an fsync per Put). At 2 MiB the sets are within the noise.
//   - ValueThreshold = HeaderSize: every block (and its header) goes to the
//     value log; the LSM holds only keys and 12-byte value pointers, so it
//     stays ~60 B/block, compactions never copy block data, and the key-only
//     reindex never touches the value log. (Default 1 MiB would keep 64 KiB
//     blocks in the LSM and rewrite them on every compaction.)
//   - ValueLogFileSize = vlogFileSizeFor(capacity): see there.
//   - MemTableSize 16 MiB: entries are ~100 B, so this is ~150k blocks; the
//     15% batch limit (2.4 MiB) counts pointers, not values, so batches of
//     large blocks are fine.
//   - BaseLevelSize 256 MiB: keeps the whole key LSM in one level up to ~4M
//     blocks, so every L0 compaction reaches the bottom and drops deleted
//     keys at once — which is when badger learns value-log discard stats,
//     the only input its GC uses to pick a file.
//   - NumVersionsToKeep 1, DetectConflicts off (no transactions across
//     keys), Compression None (KV data does not compress; it only touches
//     SST blocks anyway), BlockCacheSize 0 and IndexCacheSize 0 (no
//     compression/encryption → tables are read via mmap, no cache needed).
//   - VerifyValueChecksum stays false: we verify our own XXH3-128 on every
//     read, which also binds the value to its key.
//   - MetricsEnabled false: badger's expvar metrics are process globals.
func badgerOptions(dir string, o Options, log *slog.Logger, vlogSize int64) badger.Options {
	bo := badger.DefaultOptions(dir).
		WithLogger(badgerLogger{log}).
		WithSyncWrites(o.SyncWrites).
		WithValueThreshold(HeaderSize).
		WithValueLogFileSize(vlogSize).
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
// the store starts empty.
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
		kick:     make(chan struct{}, 1),
		passDone: make(chan struct{}),
	}
	s.vlogFileSize = vlogFileSizeFor(opts.CapacityBytes)
	s.maxBlock = s.vlogFileSize - 1<<20
	C := opts.CapacityBytes
	s.flushBytes = max(s.vlogFileSize, min(C/32, 4*s.vlogFileSize))
	// Room for: the head value-log file (never collectable), deletions not
	// yet published to GC, one partly-dead file, the LSM and small files.
	reserve := 2*s.vlogFileSize + s.flushBytes + 4<<20
	s.baseLimit = min(C-reserve, C*9/10)
	if s.baseLimit < C/4 {
		s.baseLimit = C / 4
	}
	s.softCap = C - s.vlogFileSize/2
	s.lastFlush.Store(time.Now().UnixNano())

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
	if err := s.reindex(ctx); err != nil {
		db.Close()
		lk.release()
		return nil, err
	}
	s.measure()
	lctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go s.loop(lctx)
	return s, nil
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
	return badger.Open(badgerOptions(dir, s.opts, s.log, s.vlogFileSize))
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

// reindex rebuilds the index from keys only. Recency after a restart is
// the badger commit version (write order): the oldest write is evicted
// first. Reads do not rewrite a key, so read recency of the previous run is
// not persisted; in the tier chain a block that is read is promoted and,
// when demoted again, Put anew, which refreshes its version.
func (s *Store) reindex(ctx context.Context) error {
	start := time.Now()
	type kv struct {
		ver uint64
		i   int32
	}
	x := newIndex(0)
	var order []kv
	var bad [][]byte
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
			if !ok {
				bad = append(bad, item.KeyCopy(nil))
				continue
			}
			size, ok := sizeFromValueSize(item.ValueSize())
			if !ok {
				size = max(item.ValueSize()-HeaderSize, 0) // corrected by Get
			}
			x.put(k, size, false)
			i, _ := x.get(k)
			order = append(order, kv{item.Version(), i})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("nvme: reindex: %w", err)
	}
	// Relink in version order: newest at the head.
	sort.Slice(order, func(a, b int) bool { return order[a].ver < order[b].ver })
	x.head, x.tail = nilIdx, nilIdx
	for _, o := range order {
		x.pushFront(o.i)
	}
	if len(bad) > 0 {
		s.log.Warn("nvme: dropping malformed keys", "count", len(bad))
		wb := s.db.NewWriteBatch()
		for _, k := range bad {
			_ = wb.Delete(k)
		}
		_ = wb.Flush()
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

func (s *Store) limit() int64 {
	return max(s.baseLimit-s.penalty, s.opts.CapacityBytes/8)
}

func charged(size int64) int64 { return size + blockOverhead }

// MaxBlockBytes returns the largest block Put accepts (one value-log file
// minus slack).
func (s *Store) MaxBlockBytes() int64 { return s.maxBlock }

var putBufs sync.Pool

// Put stores block under k, replacing any previous block. If the budget
// would be exceeded it first evicts least-recently-used blocks. If the
// measured disk usage is over capacity (GC has not caught up), Put waits up
// to one second for a maintenance pass and then fails with ErrNoSpace.
func (s *Store) Put(k Key, block []byte) error {
	size := int64(len(block))
	if size > s.maxBlock {
		return fmt.Errorf("%w: %d > %d", ErrTooLarge, size, s.maxBlock)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	if err := s.waitRoom(charged(size)); err != nil {
		return err
	}

	var kb [keyLen]byte
	encodeKey(&kb, k)
	need := HeaderSize + len(block)
	bp, _ := putBufs.Get().(*[]byte)
	if bp == nil || cap(*bp) < need {
		b := make([]byte, need)
		bp = &b
	}
	defer putBufs.Put(bp)
	val := encodeValue(*bp, &kb, block)

	s.gate.RLock()
	defer s.gate.RUnlock()
	my := stripeOf(k)
	s.stripes[my].Lock()
	defer s.stripes[my].Unlock()

	s.mu.Lock()
	old := int64(-1)
	if i, ok := s.idx.get(k); ok {
		old = s.idx.ents[i].size
	}
	over := s.idx.bytes + int64(s.idx.len())*blockOverhead + charged(size) - s.limit()
	if old >= 0 {
		over -= charged(old)
	}
	victims := s.pickVictimsLocked(over, k, my)
	s.mu.Unlock()

	err := s.db.Update(func(txn *badger.Txn) error {
		for _, v := range victims {
			var vb [keyLen]byte
			encodeKey(&vb, v.key)
			if err := txn.Delete(vb[:]); err != nil {
				return err
			}
		}
		return txn.SetEntry(badger.NewEntry(kb[:], val))
	})
	s.mu.Lock()
	if err != nil {
		// Nothing was written: the victims are still on disk, put them back
		// as the coldest entries.
		for _, v := range victims {
			if _, ok := s.idx.get(v.key); !ok {
				s.idx.put(v.key, v.size, true)
			}
		}
	} else {
		s.idx.put(k, size, false)
	}
	s.mu.Unlock()
	s.unlockVictims(victims, my)
	if err != nil {
		return fmt.Errorf("nvme: put: %w", err)
	}
	s.puts.Add(1)
	s.writtenSince.Add(int64(len(val)) + blockOverhead)
	var freed int64
	for _, v := range victims {
		freed += charged(v.size)
	}
	if old >= 0 {
		freed += charged(old)
	}
	s.evictions.Add(uint64(len(victims)))
	s.addGarbage(freed)
	return nil
}

type victim struct {
	key    Key
	size   int64
	stripe int
}

// pickVictimsLocked removes LRU entries totalling at least over bytes
// (charged) from the index and returns them with their stripes locked
// (except held, which the caller holds). Entries whose stripe is busy are
// skipped: someone is writing or deleting them right now. Requires s.mu.
func (s *Store) pickVictimsLocked(over int64, exclude Key, held int) []victim {
	if over <= 0 {
		return nil
	}
	var vs []victim
	var locked [nStripes]bool
	for i := s.idx.tail; i != nilIdx && over > 0 && len(vs) < maxVictimsPerPut; {
		e := s.idx.ents[i]
		prev := e.prev
		if e.key != exclude && (s.opts.Unevictable == nil || !s.opts.Unevictable(e.key)) {
			st := stripeOf(e.key)
			ok := st == held || locked[st]
			if !ok && s.stripes[st].TryLock() {
				locked[st], ok = true, true
			}
			if ok {
				vs = append(vs, victim{e.key, e.size, st})
				over -= charged(e.size)
			}
		}
		i = prev
	}
	for _, v := range vs {
		s.idx.remove(v.key)
	}
	return vs
}

func (s *Store) unlockVictims(vs []victim, held int) {
	var done [nStripes]bool
	for _, v := range vs {
		if v.stripe != held && !done[v.stripe] {
			done[v.stripe] = true
			s.stripes[v.stripe].Unlock()
		}
	}
}

func (s *Store) addGarbage(n int64) {
	if n <= 0 {
		return
	}
	if s.pendingGarbage.Add(n) >= s.flushBytes {
		s.wake()
	}
}

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// waitRoom blocks (≤1s) while the estimated disk usage plus n is over
// capacity, waking the maintenance loop.
func (s *Store) waitRoom(n int64) error {
	deadline := time.Now().Add(time.Second)
	for {
		est := s.diskMeasured.Load() + s.writtenSince.Load()
		if est+n <= s.opts.CapacityBytes {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			s.noSpace.Add(1)
			return fmt.Errorf("%w: estimated %d + %d > %d", ErrNoSpace, est, n, s.opts.CapacityBytes)
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
	if !ok {
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
	var (
		n    int
		derr error
		ver  uint64
	)
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(kb[:])
		if err != nil {
			return err
		}
		ver = item.Version()
		return item.Value(func(v []byte) error {
			n, derr = decodeInto(&kb, v, dst)
			return nil
		})
	})
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		s.mu.Lock()
		if j, ok := s.idx.get(k); ok && s.idx.ents[j].size == size {
			s.idx.remove(k)
		}
		s.mu.Unlock()
		s.misses.Add(1)
		return 0, ErrNotFound
	case errors.Is(err, badger.ErrDBClosed):
		return 0, ErrClosed
	case err != nil:
		// Badger could not read the value (e.g. a value pointer into a
		// damaged or missing value-log region): treat as corrupt.
		derr = err
	case errors.Is(derr, errShort):
		// The stored block is longer than the index said (inexact size
		// after reindex): fix the index, let the caller retry.
		s.mu.Lock()
		if j, ok := s.idx.get(k); ok {
			s.idx.bytes += int64(n) - s.idx.ents[j].size
			s.idx.ents[j].size = int64(n)
		}
		s.mu.Unlock()
		return n, ErrShortBuffer
	}
	if derr != nil {
		s.checksumMisses.Add(1)
		s.misses.Add(1)
		s.log.Warn("nvme: block failed verification; deleting it", "ns", k.NS, "hash_hi", k.Hash.Hi, "hash_lo", k.Hash.Lo, "err", derr)
		s.dropCorrupt(k, kb, ver)
		return 0, fmt.Errorf("%w (%w)", ErrNotFound, ErrChecksum)
	}
	if int64(n) != size {
		s.mu.Lock()
		if j, ok := s.idx.get(k); ok && s.idx.ents[j].size == size {
			s.idx.bytes += int64(n) - size
			s.idx.ents[j].size = int64(n)
		}
		s.mu.Unlock()
	}
	s.hits.Add(1)
	return n, nil
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
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(kb[:]) }); err != nil {
		s.log.Warn("nvme: delete of corrupt block failed", "err", err)
	}
	s.mu.Lock()
	sz := s.idx.remove(k)
	s.mu.Unlock()
	s.addGarbage(charged(max(sz, 0)))
}

// Contains reports whether k is in the index. No I/O.
func (s *Store) Contains(k Key) bool {
	s.mu.Lock()
	_, ok := s.idx.get(k)
	s.mu.Unlock()
	return ok
}

// Size returns the size of k's block from the index (no I/O).
func (s *Store) Size(k Key) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.idx.get(k); ok {
		return s.idx.ents[i].size, true
	}
	return 0, false
}

// Delete removes k. Deleting an absent key is not an error.
func (s *Store) Delete(k Key) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	s.gate.RLock()
	defer s.gate.RUnlock()
	st := stripeOf(k)
	s.stripes[st].Lock()
	defer s.stripes[st].Unlock()
	s.mu.Lock()
	_, ok := s.idx.get(k)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	var kb [keyLen]byte
	encodeKey(&kb, k)
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(kb[:]) }); err != nil {
		return fmt.Errorf("nvme: delete: %w", err)
	}
	s.mu.Lock()
	sz := s.idx.remove(k)
	s.mu.Unlock()
	s.addGarbage(charged(max(sz, 0)))
	return nil
}

// DeleteNS removes every block of namespace ns and returns how many were in
// the index. It writes one tombstone per block (a WriteBatch) while writes
// to the store are paused, then wakes the maintenance loop, which flushes
// the LSM and lets value-log GC reclaim the space.
//
// It deliberately does not use badger's DropPrefix: DropPrefix discards
// memtable-resident keys during its flush, and whole tables inside the
// prefix, without recording value-log discard stats, so the value-log bytes
// of those blocks would never be collected (badger v4.9.6).
func (s *Store) DeleteNS(ns uint32) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	s.gate.Lock()
	defer s.gate.Unlock()
	var keys []Key
	s.mu.Lock()
	s.idx.walk(func(k Key, size int64) bool {
		if k.NS == ns {
			keys = append(keys, k)
		}
		return true
	})
	s.mu.Unlock()
	wb := s.db.NewWriteBatch()
	for _, k := range keys {
		var kb [keyLen]byte
		encodeKey(&kb, k)
		if err := wb.Delete(kb[:]); err != nil {
			wb.Cancel()
			return 0, fmt.Errorf("nvme: delete namespace %d: %w", ns, err)
		}
	}
	if err := wb.Flush(); err != nil {
		return 0, fmt.Errorf("nvme: delete namespace %d: %w", ns, err)
	}
	var freed int64
	s.mu.Lock()
	for _, k := range keys {
		freed += charged(max(s.idx.remove(k), 0))
	}
	s.mu.Unlock()
	s.addGarbage(freed)
	if len(keys) > 0 {
		s.wake()
	}
	return len(keys), nil
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
	s.idx.walk(func(k Key, n int64) bool { snap = append(snap, ks{k, n}); return true })
	s.mu.Unlock()
	for _, e := range snap {
		if !fn(e.k, e.n) {
			return
		}
	}
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	st := Stats{Blocks: s.idx.len(), Bytes: s.idx.bytes, LogicalLimit: s.limit()}
	s.mu.Unlock()
	st.DiskBytes = s.diskMeasured.Load()
	st.Capacity = s.opts.CapacityBytes
	st.Hits, st.Misses = s.hits.Load(), s.misses.Load()
	st.ChecksumMisses = s.checksumMisses.Load()
	st.Evictions, st.Puts, st.NoSpace = s.evictions.Load(), s.puts.Load(), s.noSpace.Load()
	st.GCRuns, st.LSMFlushes = s.gcRuns.Load(), s.flushes.Load()
	st.ReindexBlocks, st.ReindexDuration = s.reindexBlocks, s.reindexDuration
	st.MovedAside = s.movedAside
	return st
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
	err := s.db.Close()
	if lerr := s.lock.release(); err == nil {
		err = lerr
	}
	return err
}
