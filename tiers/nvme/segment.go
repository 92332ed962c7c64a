package nvme

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Block payloads live in append-only segment files under Dir/segments,
// written with large direct (O_DIRECT) pwrites; badger holds only the
// index record (key → segment, offset, length, checksum). See the package
// doc, "On-disk format".

const (
	segDirName = "segments"
	segSuffix  = ".seg"
	// nLanes is the number of segments appended to concurrently. Each lane
	// appends sequentially to its own file, so two writers (the mover and a
	// flush, or compaction) do not serialize on one file's inode lock.
	nLanes = 2
)

var errSegmentGone = errors.New("segment removed")

type segment struct {
	id     uint32
	path   string
	f      *os.File
	direct bool
	// mu: RLock around every pread/pwrite of f, Lock to close it.
	mu     sync.RWMutex
	closed bool
	// size is the append offset; written only by the lane that owns the
	// segment (under the lane's mutex), read by maintenance.
	size atomic.Int64
	// live is the bytes of records the index points at, plus records being
	// written (charged before the badger commit, released if it fails).
	live    atomic.Int64
	pending atomic.Int32 // appends not yet committed or released
	active  atomic.Bool  // owned by a lane (never compacted or removed)
	dirty   atomic.Bool  // written since the last Sync
}

type lane struct {
	mu  sync.Mutex
	seg *segment
}

// segStore manages the segment files.
type segStore struct {
	dir      string
	offAlign int64 // record offsets and lengths are multiples of this
	memAlign int
	fileSize int64 // a lane rotates to a new segment beyond this
	syncEach bool  // fdatasync after every append (Options.SyncWrites)

	mu   sync.Mutex
	segs map[uint32]*segment
	next uint32

	lanes [nLanes]lane
	rr    atomic.Uint32

	bufs sync.Pool // *[]byte, aligned bounce buffers

	writes atomic.Uint64 // appends written (Stats.SegmentWrites)
	reads  atomic.Uint64 // reads issued (Stats.SegmentReads)
	// dirDirty: a segment was created since the directory was last
	// fsynced; until it is, a power loss can lose the new file's entry
	// (its records would then be dropped at reindex: misses).
	dirDirty atomic.Bool
	dirSyncs atomic.Uint64 // directory fsyncs (tests)
}

// syncDir fsyncs the segment directory, making created files' entries
// durable.
func (ss *segStore) syncDir() error {
	d, err := os.Open(ss.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", ss.dir, err)
	}
	ss.dirSyncs.Add(1)
	return nil
}

func segName(id uint32) string { return fmt.Sprintf("%08d%s", id, segSuffix) }

// openSegStore opens (creating) dir and every segment in it. New appends
// always go to new segments, so a torn tail is never appended to.
func openSegStore(dir string, fileSize int64, syncEach bool) (*segStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	oa, ma := dioAlign(dir)
	ss := &segStore{dir: dir, offAlign: int64(oa), memAlign: ma, fileSize: fileSize, syncEach: syncEach, segs: map[uint32]*segment{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, segSuffix) {
			continue
		}
		id, err := strconv.ParseUint(strings.TrimSuffix(name, segSuffix), 10, 32)
		if err != nil || name != segName(uint32(id)) {
			continue // not a name we write ("0.seg" would alias 00000000.seg)
		}
		p := filepath.Join(dir, name)
		f, direct, err := openSegmentFile(p, false)
		if err != nil {
			ss.closeAll()
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			ss.closeAll()
			return nil, err
		}
		sg := &segment{id: uint32(id), path: p, f: f, direct: direct}
		sg.size.Store(fi.Size())
		ss.segs[sg.id] = sg
		ss.next = max(ss.next, uint32(id)+1)
	}
	return ss, nil
}

// recLen is the on-disk length of a record with an n-byte payload.
func (ss *segStore) recLen(n int64) int64 {
	return (n + ss.offAlign - 1) / ss.offAlign * ss.offAlign
}

func (ss *segStore) aligned(b []byte) bool {
	return len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%uintptr(ss.memAlign) == 0
}

// getBuf returns an aligned buffer of length n (pooled).
func (ss *segStore) getBuf(n int) *[]byte {
	if bp, _ := ss.bufs.Get().(*[]byte); bp != nil && cap(*bp) >= n {
		*bp = (*bp)[:n]
		return bp
	}
	b := make([]byte, n+ss.memAlign)
	off := (ss.memAlign - int(uintptr(unsafe.Pointer(&b[0]))%uintptr(ss.memAlign))) % ss.memAlign
	b = b[off : off+n : off+n]
	return &b
}

func (ss *segStore) putBuf(bp *[]byte) { ss.bufs.Put(bp) }

// newSegmentLocked creates the next segment file. Requires ss.mu.
func (ss *segStore) newSegmentLocked() (*segment, error) {
	id := ss.next
	ss.next++
	p := filepath.Join(ss.dir, segName(id))
	f, direct, err := openSegmentFile(p, true)
	if err != nil {
		return nil, err
	}
	if ss.syncEach {
		// Every append is durable when it returns: so is the file's entry.
		if err := ss.syncDir(); err != nil {
			f.Close()
			os.Remove(p)
			return nil, err
		}
	} else {
		ss.dirDirty.Store(true) // for the next sync
	}
	sg := &segment{id: id, path: p, f: f, direct: direct}
	sg.active.Store(true)
	ss.segs[id] = sg
	return sg, nil
}

// retire ends appends to sg (it becomes collectable). Segments are not
// preallocated: on the development VM fallocate made no difference
// measurable through the device's noise, and it would put up to
// nLanes·F of allocated-but-unwritten space into the disk budget.
// Requires the lane's mutex.
func (ss *segStore) retire(sg *segment) { sg.active.Store(false) }

// append writes payload as one record and returns where. The record's
// length is charged to the segment's live bytes and its pending count is
// raised; the caller must call commit or release afterwards.
func (ss *segStore) append(payload []byte) (seg uint32, off int64, err error) {
	var offs [1]int64
	seg, err = ss.appendMany([][]byte{payload}, offs[:])
	return seg, offs[0], err
}

// appendMany writes payloads as consecutive records of one segment, with
// one write, and stores each record's offset in offs. Every record is
// charged and pending as with append; on error none is.
func (ss *segStore) appendMany(payloads [][]byte, offs []int64) (seg uint32, err error) {
	var total int64
	for _, p := range payloads {
		total += ss.recLen(int64(len(p)))
	}
	start := ss.rr.Add(1)
	var l *lane
	for i := range uint32(nLanes) {
		if c := &ss.lanes[(start+i)%nLanes]; c.mu.TryLock() {
			l = c
			break
		}
	}
	if l == nil {
		l = &ss.lanes[start%nLanes]
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	if l.seg == nil || (l.seg.size.Load() > 0 && l.seg.size.Load()+total > ss.fileSize) {
		if l.seg != nil {
			ss.retire(l.seg)
		}
		ss.mu.Lock()
		sg, err := ss.newSegmentLocked()
		ss.mu.Unlock()
		if err != nil {
			l.seg = nil
			return 0, fmt.Errorf("new segment: %w", err)
		}
		l.seg = sg
	}
	sg := l.seg
	off := sg.size.Load()
	sg.live.Add(total)
	sg.pending.Add(int32(len(payloads)))
	undo := func() {
		sg.live.Add(-total)
		sg.pending.Add(-int32(len(payloads)))
	}
	if err := ss.writeRecords(sg, payloads, off, total); err != nil {
		undo()
		// Nothing points at the failed region; the next append overwrites it.
		return 0, err
	}
	ss.writes.Add(1)
	for i, p := range payloads {
		offs[i] = off
		off += ss.recLen(int64(len(p)))
	}
	sg.size.Store(off)
	sg.dirty.Store(true)
	if ss.syncEach {
		if err := fdatasync(sg.f); err != nil {
			undo()
			return 0, err
		}
	}
	return sg.id, nil
}

// writeRecords writes payloads (each padded with zeros to its record
// length; total bytes in all) at off: straight from the callers' memory
// when every payload is aligned for direct I/O and a multiple of the
// alignment (one pwritev for several), else through an aligned bounce
// buffer.
func (ss *segStore) writeRecords(sg *segment, payloads [][]byte, off, total int64) error {
	sg.mu.RLock()
	defer sg.mu.RUnlock()
	if sg.closed {
		return errSegmentGone
	}
	if total == 0 {
		return nil
	}
	direct := true
	for _, p := range payloads {
		if len(p) > 0 && (int64(len(p)) != ss.recLen(int64(len(p))) || (sg.direct && !ss.aligned(p))) {
			direct = false
			break
		}
	}
	if direct {
		if len(payloads) == 1 {
			_, err := sg.f.WriteAt(payloads[0], off)
			return err
		}
		bufs := make([][]byte, 0, len(payloads))
		for _, p := range payloads {
			if len(p) > 0 {
				bufs = append(bufs, p)
			}
		}
		return writevAt(sg.f, bufs, off)
	}
	bp := ss.getBuf(int(total))
	defer ss.putBuf(bp)
	b := *bp
	at := int64(0)
	for _, p := range payloads {
		c := copy(b[at:], p)
		rl := ss.recLen(int64(len(p)))
		clear(b[at+int64(c) : at+rl])
		at += rl
	}
	_, err := sg.f.WriteAt(b, off)
	return err
}

// retireDeadLanes detaches the segments lanes append to that hold no live
// record (everything in them was deleted), so they can be removed: after
// a mass delete the space comes back without waiting for the next Puts
// to fill them. Busy lanes are skipped.
func (ss *segStore) retireDeadLanes() {
	for i := range ss.lanes {
		l := &ss.lanes[i]
		if !l.mu.TryLock() {
			continue
		}
		if sg := l.seg; sg != nil && sg.size.Load() > 0 && sg.live.Load() <= 0 && sg.pending.Load() == 0 {
			ss.retire(sg)
			l.seg = nil
		}
		l.mu.Unlock()
	}
}

// commit marks an append as indexed.
func (ss *segStore) commit(seg uint32) {
	if sg := ss.get(seg); sg != nil {
		sg.pending.Add(-1)
	}
}

// release uncharges a record of an n-byte payload in seg (deleted,
// overwritten, evicted, or an append whose commit failed: then pending
// too). It reports whether the segment became reclaimable.
func (ss *segStore) release(seg uint32, n int64, wasPending bool) bool {
	sg := ss.get(seg)
	if sg == nil {
		return false
	}
	if wasPending {
		sg.pending.Add(-1)
	}
	return sg.live.Add(-ss.recLen(n)) <= 0 && !sg.active.Load()
}

func (ss *segStore) get(seg uint32) *segment {
	ss.mu.Lock()
	sg := ss.segs[seg]
	ss.mu.Unlock()
	return sg
}

// check reports whether a record of n bytes at off lies within segment
// seg as written so far: errSegmentGone if the segment is gone (compaction
// relocates records: look the record up again), an error if the record
// runs past the segment's end (it is corrupt).
func (ss *segStore) check(seg uint32, off, n int64) error {
	sg := ss.get(seg)
	if sg == nil {
		return errSegmentGone
	}
	if !ss.within(sg, off, n) {
		return fmt.Errorf("record of %d bytes at offset %d runs past the end of segment %d (%d bytes)", n, off, seg, sg.size.Load())
	}
	return nil
}

// within reports whether a record of n bytes at off lies within sg as
// written so far.
func (ss *segStore) within(sg *segment, off, n int64) bool {
	return off >= 0 && n >= 0 && off <= sg.size.Load()-ss.recLen(n)
}

// read reads the n-byte payload at (seg, off) into dst[:n]: directly when
// dst is aligned and n a multiple of the alignment, else through a bounce
// buffer. A missing segment is errSegmentGone; a short file is an error.
func (ss *segStore) read(seg uint32, off, n int64, dst []byte) error {
	if n == 0 {
		return nil // an empty record occupies no space: its segment may be gone
	}
	sg := ss.get(seg)
	if sg == nil {
		return errSegmentGone
	}
	sg.mu.RLock()
	defer sg.mu.RUnlock()
	if sg.closed {
		return errSegmentGone
	}
	if n == 0 {
		return nil
	}
	ss.reads.Add(1)
	if !sg.direct || (n%ss.offAlign == 0 && ss.aligned(dst)) {
		_, err := sg.f.ReadAt(dst[:n], off)
		return err
	}
	rl := ss.recLen(n)
	bp := ss.getBuf(int(rl))
	defer ss.putBuf(bp)
	if _, err := sg.f.ReadAt(*bp, off); err != nil {
		return err
	}
	copy(dst[:n], *bp)
	return nil
}

// remove closes and deletes seg. It waits for reads in flight.
func (ss *segStore) remove(seg uint32) error {
	ss.mu.Lock()
	sg := ss.segs[seg]
	delete(ss.segs, seg)
	ss.mu.Unlock()
	if sg == nil {
		return nil
	}
	sg.mu.Lock()
	sg.closed = true
	err := sg.f.Close()
	sg.mu.Unlock()
	if rerr := os.Remove(sg.path); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// snapshot returns the segments (for maintenance).
func (ss *segStore) snapshot() []*segment {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*segment, 0, len(ss.segs))
	for _, sg := range ss.segs {
		out = append(out, sg)
	}
	return out
}

// sync fdatasyncs every segment written since the last sync.
func (ss *segStore) sync() error {
	var first error
	if ss.dirDirty.Swap(false) {
		if err := ss.syncDir(); err != nil {
			first = err
			ss.dirDirty.Store(true)
		}
	}
	for _, sg := range ss.snapshot() {
		if !sg.dirty.Swap(false) {
			continue
		}
		sg.mu.RLock()
		if !sg.closed {
			if err := fdatasync(sg.f); err != nil && first == nil {
				first = err
				sg.dirty.Store(true)
			}
		}
		sg.mu.RUnlock()
	}
	return first
}

func (ss *segStore) closeAll() error {
	for i := range ss.lanes {
		l := &ss.lanes[i]
		l.mu.Lock()
		if l.seg != nil {
			ss.retire(l.seg)
			l.seg = nil
		}
		l.mu.Unlock()
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var first error
	for id, sg := range ss.segs {
		sg.mu.Lock()
		if !sg.closed {
			sg.closed = true
			if err := sg.f.Close(); err != nil && first == nil {
				first = err
			}
		}
		sg.mu.Unlock()
		delete(ss.segs, id)
	}
	return first
}

// retireDrained lets go of lane segments whose every record is dead, so GC
// can remove them (a lane rotates only on append; with a full disk no
// append succeeds, so a lane's segment full of deleted blocks would never
// be reclaimed).
func (ss *segStore) retireDrained() {
	for i := range ss.lanes {
		l := &ss.lanes[i]
		if !l.mu.TryLock() {
			continue
		}
		if sg := l.seg; sg != nil && sg.size.Load() > 0 && sg.live.Load() <= 0 && sg.pending.Load() == 0 {
			ss.retire(sg)
			l.seg = nil
		}
		l.mu.Unlock()
	}
}
