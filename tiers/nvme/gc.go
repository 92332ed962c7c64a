package nvme

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// loop is the store's maintenance goroutine (the deleter is the other). It runs a maintenance pass every
// GCInterval and whenever Put/Delete wake it (a segment became empty, or a
// Put waits for room).
func (s *Store) loop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
		s.maintain(ctx)
	}
}

// maintain is one pass:
//  1. remove segments no live block points into;
//  2. compact segments at least half dead (relocate their live blocks to
//     the head, then remove them);
//  3. measure the directory; if it is over the soft cap, compact harder
//     (20% dead) and, if still over, lower the logical limit by the excess
//     (adaptive penalty) and evict down to it; when under, relax the penalty.
func (s *Store) maintain(ctx context.Context) {
	defer s.passFinished()
	s.writeLateDeletes()
	s.runGC(ctx, 0.5)
	disk := s.measure()
	if softCap := s.bud.Load().softCap; disk <= softCap {
		s.mu.Lock()
		if s.penalty > 0 {
			s.penalty = max(0, s.penalty-(softCap-disk)/4)
		}
		s.mu.Unlock()
		return
	}
	s.runGC(ctx, 0.2)
	softCap := s.bud.Load().softCap
	if disk = s.measure(); disk <= softCap {
		return
	}
	s.mu.Lock()
	// Past baseLimit − capacity/8 the limit is at its floor and a larger
	// penalty evicts nothing more: it only grows while the excess is bytes
	// no eviction can remove (unevictable blocks over a capacity lowered
	// under them), and would hold the limit at its floor long after the
	// capacity is raised back (the penalty decays by a quarter of the
	// headroom per pass).
	b := s.bud.Load()
	s.penalty = min(s.penalty+disk-softCap, max(0, b.baseLimit-b.capacity/8))
	limit := s.limit()
	s.mu.Unlock()
	s.log.Debug("nvme: over soft cap; shrinking logical limit", "disk", disk, "soft_cap", softCap, "limit", limit)
	s.evictDown()
	s.runGC(ctx, 0.5)
	s.measure()
}

func (s *Store) passFinished() {
	s.mu.Lock()
	close(s.passDone)
	s.passDone = make(chan struct{})
	s.mu.Unlock()
}

// runGC removes empty segments and compacts those whose dead fraction is
// at least ratio, most dead first. Segments lanes append to, and segments
// with appends not yet indexed, are skipped.
func (s *Store) runGC(ctx context.Context, ratio float64) {
	type cand struct {
		sg   *segment
		dead float64
	}
	s.segs.retireDeadLanes()
	var cands []cand
	s.segs.retireDrained()
	for _, sg := range s.segs.snapshot() {
		if sg.active.Load() || sg.pending.Load() > 0 {
			continue
		}
		size, live := sg.size.Load(), sg.live.Load()
		if live <= 0 {
			s.removeSegment(sg.id)
			continue
		}
		if size > 0 {
			if d := float64(size-live) / float64(size); d >= ratio {
				cands = append(cands, cand{sg, d})
			}
		}
	}
	sort.Slice(cands, func(a, b int) bool { return cands[a].dead > cands[b].dead })
	for _, c := range cands {
		if ctx.Err() != nil {
			return
		}
		// Compaction copies before it frees: skip a segment whose live
		// bytes would not fit under the capacity meanwhile. Once the disk
		// is over the capacity already (SetCapacity shrank it), compacting
		// is the way back under: then it only needs the filesystem's room.
		disk, live, capacity := s.diskMeasured.Load()+s.writtenSince.Load()+s.admitted.Load(), c.sg.live.Load(), s.capacity()
		if disk+live > capacity && (disk <= capacity || live > s.fsAvail.Load()-fsReserve) {
			continue
		}
		s.compact(ctx, c.sg, live)
	}
}

func (s *Store) removeSegment(id uint32) {
	if err := s.segs.remove(id); err != nil {
		s.log.Warn("nvme: cannot remove segment", "segment", id, "err", err)
		return
	}
	s.gcRuns.Add(1)
}

// compact relocates every live block of sg to the head and removes sg.
// Each block is moved under its key's stripe lock, read, verified (a block
// that fails is dropped and counted like a failed Get), appended anew and
// its index record rewritten; a block whose stripe is busy is left for a
// later pass. reserve (sg's live bytes when runGC found room for them) is
// counted in admitted until the moves have written it, so that waitRoom
// does not let Puts into the room the copies take meanwhile.
func (s *Store) compact(ctx context.Context, sg *segment, reserve int64) {
	s.admitted.Add(reserve)
	defer func() { s.admitted.Add(-reserve) }()
	var keys []Key
	s.mu.Lock()
	for i := range s.idx.ents {
		e := &s.idx.ents[i]
		if e.seg == sg.id && e.size >= 0 {
			if j, ok := s.idx.m[e.key]; ok && j == int32(i) {
				keys = append(keys, e.key)
			}
		}
	}
	s.mu.Unlock()
	var buf *[]byte
	defer func() {
		if buf != nil {
			s.segs.putBuf(buf)
		}
	}()
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		w := min(s.relocate(k, sg.id, &buf), reserve)
		reserve -= w
		s.admitted.Add(-w) // in writtenSince now
	}
	if sg.live.Load() <= 0 && sg.pending.Load() == 0 {
		s.removeSegment(sg.id)
	}
}

// relocate moves k out of segment from (see compact) and returns the
// bytes it wrote.
func (s *Store) relocate(k Key, from uint32, buf **[]byte) int64 {
	s.gate.RLock()
	defer s.gate.RUnlock()
	st := stripeOf(k)
	if !s.stripes[st].TryLock() {
		return 0
	}
	defer s.stripes[st].Unlock()
	s.mu.Lock()
	i, ok := s.idx.get(k)
	if !ok || s.idx.ents[i].seg != from {
		s.mu.Unlock()
		return 0
	}
	s.mu.Unlock()

	var kb [keyLen]byte
	encodeKey(&kb, k)
	var (
		rec record
		ver uint64
	)
	ok = false
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
	if errors.Is(err, badger.ErrDBClosed) {
		return 0
	}
	if err == nil && ok && rec.seg != from {
		return 0 // not ours (cannot happen under the stripe lock)
	}
	if err == nil && ok {
		if *buf == nil || int64(cap(**buf)) < s.segs.recLen(rec.n) {
			if *buf != nil {
				s.segs.putBuf(*buf)
			}
			*buf = s.segs.getBuf(int(s.segs.recLen(max(rec.n, 1))))
		}
		b := (**buf)[:rec.n]
		if err = s.segs.read(rec.seg, rec.offset, rec.n, b); err == nil && !rec.verify(&kb, b) {
			err = errors.New("checksum mismatch")
		}
		if err == nil {
			return s.move(k, kb, rec, b)
		}
	} else if err == nil {
		err = errors.New("malformed index record")
	}
	if !errors.Is(err, badger.ErrKeyNotFound) {
		s.checksumMisses.Add(1)
		s.log.Warn("nvme: block failed verification during compaction; deleting it", "ns", k.NS, "err", err)
	}
	// Drop it: delete the record (if still this version) and the entry.
	// With no room to log the deletion (deletionRoom) the record stays, out
	// of the index, as dropCorrupt leaves it.
	if s.deletionRoom() > 0 {
		_ = s.db.Update(func(txn *badger.Txn) error {
			item, gerr := txn.Get(kb[:])
			if gerr != nil || item.Version() != ver {
				return nil
			}
			return txn.Delete(kb[:])
		})
	}
	s.mu.Lock()
	sz, seg := s.idx.remove(k)
	s.mu.Unlock()
	if sz >= 0 {
		s.segs.release(seg, sz, false)
	}
	return 0
}

// move appends the verified payload b and points k's record at it, and
// returns the bytes it wrote (counted in writtenSince). Requires k's
// stripe lock.
func (s *Store) move(k Key, kb [keyLen]byte, rec record, b []byte) int64 {
	if s.deletionRoom() == 0 {
		return 0 // no room to log the new record (see deletionRoom)
	}
	seg, off, err := s.segs.append(b)
	if err != nil {
		s.log.Warn("nvme: compaction append failed", "err", err)
		return 0
	}
	if s.testHook != nil {
		s.testHook("move")
	}
	old := rec.seg
	rec.seg, rec.offset = seg, off
	var rb [recordLen]byte
	rec.encode(&rb)
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.SetEntry(badger.NewEntry(kb[:], rb[:])) }); err != nil {
		s.segs.release(seg, rec.n, true)
		s.log.Warn("nvme: compaction index update failed", "err", err)
		return 0
	}
	s.mu.Lock()
	if i, ok := s.idx.get(k); ok {
		s.idx.ents[i].seg = seg
	}
	// A Delete that hid k while this held its stripe wins over the record
	// written above.
	var relog []Key
	var waits []chan struct{}
	if _, hidden := s.hidden[k]; hidden {
		relog = []Key{k}
		s.markLoggedLocked(k, false)
		if tw := s.tombs[k]; tw != nil {
			waits = []chan struct{}{tw.done}
		}
	}
	s.mu.Unlock()
	s.relogDeletes(relog, waits)
	s.segs.commit(seg)
	s.segs.release(old, rec.n, false)
	w := s.segs.recLen(rec.n)
	s.writtenSince.Add(w)
	s.moved.Add(1)
	return w
}

// evictDown evicts LRU blocks until the index is under the current limit,
// in rounds of as many deletions as the filesystem has room for
// (deletionRoom); with no room left it stops, and a later pass goes on once
// the segments emptied so far are removed.
func (s *Store) evictDown() {
	s.gate.RLock()
	defer s.gate.RUnlock()
	for {
		s.mu.Lock()
		over := s.chargedLocked() - s.limit()
		s.mu.Unlock()
		if over <= 0 {
			return
		}
		room := s.deletionRoom()
		if room == 0 {
			s.log.Warn("nvme: filesystem full; eviction postponed", "dir", s.dir)
			return
		}
		s.mu.Lock()
		over = s.chargedLocked() - s.limit()
		vs, _ := s.pickVictimsLocked(over, room, nil, nil)
		s.mu.Unlock()
		if len(vs) == 0 {
			return
		}
		err := s.db.Update(func(txn *badger.Txn) error {
			for _, v := range vs {
				var kb [keyLen]byte
				encodeKey(&kb, v.key)
				if err := txn.Delete(kb[:]); err != nil {
					return err
				}
			}
			return nil
		})
		s.mu.Lock()
		for _, v := range vs {
			if err != nil {
				s.idx.put(v.key, v.size, v.seg, true)
			} else {
				s.segs.release(v.seg, v.size, false)
			}
		}
		s.mu.Unlock()
		s.unlockVictims(vs, nil)
		if err != nil {
			s.log.Warn("nvme: eviction failed", "err", err)
			return
		}
		s.evictions.Add(uint64(len(vs)))
	}
}

const (
	// deletionBytes bounds what one deletion adds to badger's write-ahead
	// log (the 21-byte key, the entry header, the checksum), rounded up.
	deletionBytes = 64
	// walSlack is left free beside the deletions of a round: the pages a
	// write touches past its own bytes, the next entry's header badger
	// zeroes.
	walSlack = 32 << 10
)

// deletionRoom returns how many deletions badger can log now without
// running the filesystem out of space (at most maxVictimsPerPut). Badger
// appends to its write-ahead log through a shared mapping of a sparse
// file: a write past the filesystem's free space is SIGBUS, which kills
// the process, not an error. Put keeps fsReserve free (waitRoom); what
// writes index records without a Put before it (eviction, reindex's drops,
// Delete, DeleteNS, a Get's or compaction's drop of a corrupt block,
// compaction's relocations) asks this first, for when something else has
// filled the filesystem.
func (s *Store) deletionRoom() int {
	a, ok := fsAvail(s.dir)
	if !ok {
		return maxVictimsPerPut
	}
	return int(min(max(0, (a-walSlack)/(2*deletionBytes)), maxVictimsPerPut))
}

// measure records the allocated size of the badger directory plus the
// segments directory, and the space left on the filesystem.
func (s *Store) measure() int64 {
	s.measureMu.Lock()
	defer s.measureMu.Unlock()
	w0 := s.writtenSince.Load()
	d := DiskUsage(s.dir)
	s.diskMeasured.Store(d)
	if a, ok := fsAvail(s.dir); ok {
		s.fsAvail.Store(a)
	} else {
		s.fsAvail.Store(1 << 62)
	}
	s.writtenSince.Add(-w0)
	return d
}

// DiskUsage returns the bytes a store's directory dir occupies on disk:
// badger's files and the segments (0 if it does not exist).
func DiskUsage(dir string) int64 {
	return dirUsage(dir) + dirUsage(filepath.Join(dir, segDirName))
}

// dirUsage returns the allocated bytes of the regular files in dir.
func dirUsage(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		n += allocated(fi)
	}
	return n
}
