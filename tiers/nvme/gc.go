package nvme

import (
	"context"
	"errors"
	"os"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// loop is the store's only goroutine. It runs a maintenance pass every
// GCInterval and whenever Put/Delete wake it (pending garbage over
// flushBytes, or a Put waiting for room).
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
//  1. if deletions are pending, force a memtable flush + L0 compaction so
//     badger learns which value-log bytes are dead (its GC picks files only
//     from discard stats, which compactions produce);
//  2. run value-log GC (ratio 0.5) until it has nothing to rewrite;
//  3. measure the directory; if it is over the soft cap, GC harder (0.2)
//     and, if still over, lower the logical limit by the excess (adaptive
//     penalty) and evict down to it; when under, relax the penalty.
func (s *Store) maintain(ctx context.Context) {
	defer s.passFinished()
	pending := s.pendingGarbage.Load()
	if pending >= s.flushBytes || (pending > 0 && time.Since(time.Unix(0, s.lastFlush.Load())) >= s.opts.GCInterval) {
		s.flushLSM(pending)
	}
	s.runGC(ctx, 0.5)
	disk := s.measure()
	if disk <= s.softCap {
		s.mu.Lock()
		if s.penalty > 0 {
			s.penalty = max(0, s.penalty-(s.softCap-disk)/4)
		}
		s.mu.Unlock()
		return
	}
	s.runGC(ctx, 0.2)
	if disk = s.measure(); disk <= s.softCap {
		return
	}
	s.mu.Lock()
	s.penalty += disk - s.softCap
	s.mu.Unlock()
	s.log.Debug("nvme: over soft cap; shrinking logical limit", "disk", disk, "soft_cap", s.softCap, "limit", s.limit())
	s.evictDown()
	s.flushLSM(s.pendingGarbage.Load())
	s.runGC(ctx, 0.5)
	s.measure()
}

func (s *Store) passFinished() {
	s.mu.Lock()
	close(s.passDone)
	s.passDone = make(chan struct{})
	s.mu.Unlock()
}

func (s *Store) runGC(ctx context.Context, ratio float64) {
	for i := 0; i < 1000 && ctx.Err() == nil; i++ {
		err := s.gcOnce(ratio)
		if err != nil {
			if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
				s.log.Warn("nvme: value-log GC failed", "err", err)
			}
			return
		}
		s.gcRuns.Add(1)
	}
}

// gcOnce runs one value-log GC step. Badger v4.9.6's DB.MaxVersion (called
// at the start of every GC rewrite) reads memTable.maxVersion, which the
// write goroutine updates without a lock. The race is benign on 64-bit
// platforms (a stale, lower value only lowers gcDiscardTs, which badger
// documents as safe), but the race detector reports it, so race-enabled
// builds pause writes during GC. Production builds run GC concurrently with
// writes: serializing would stall Puts for the whole file rewrite.
func (s *Store) gcOnce(ratio float64) error {
	if raceEnabled {
		s.gate.Lock()
		defer s.gate.Unlock()
	}
	return s.db.RunValueLogGC(ratio)
}

// flushLSM forces badger to flush its memtables and compact L0, which
// publishes discard stats for deleted blocks. Badger has no public flush;
// DropPrefix of a marker key does exactly this (it blocks writes, flushes
// every memtable, then compacts L0). Writes are paused via the gate.
func (s *Store) flushLSM(pending int64) {
	s.gate.Lock()
	defer s.gate.Unlock()
	if err := s.flushLocked(); err != nil {
		s.log.Warn("nvme: forced LSM flush failed", "err", err)
		return
	}
	s.pendingGarbage.Add(-pending)
}

// flushLocked does the flush; the caller holds s.gate exclusively.
func (s *Store) flushLocked() error {
	marker := []byte{prefixMarker}
	err := s.db.Update(func(txn *badger.Txn) error { return txn.Set(marker, nil) })
	if err == nil {
		err = s.db.DropPrefix(marker)
	}
	if err != nil {
		return err
	}
	s.lastFlush.Store(time.Now().UnixNano())
	s.flushes.Add(1)
	return nil
}

// evictDown evicts LRU blocks until the index is under the current limit.
func (s *Store) evictDown() {
	s.gate.RLock()
	defer s.gate.RUnlock()
	for {
		s.mu.Lock()
		over := s.idx.bytes + int64(s.idx.len())*blockOverhead - s.limit()
		vs := s.pickVictimsLocked(over, Key{}, -1)
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
		var freed int64
		s.mu.Lock()
		for _, v := range vs {
			if err != nil {
				s.idx.put(v.key, v.size, true)
			} else {
				freed += charged(v.size)
			}
		}
		s.mu.Unlock()
		s.unlockVictims(vs, -1)
		if err != nil {
			s.log.Warn("nvme: eviction failed", "err", err)
			return
		}
		s.evictions.Add(uint64(len(vs)))
		s.pendingGarbage.Add(freed)
	}
}

// measure stats every file in the directory (badger keeps it flat: a few
// dozen files) and records the allocated total.
func (s *Store) measure() int64 {
	w0 := s.writtenSince.Load()
	d := dirUsage(s.dir)
	s.diskMeasured.Store(d)
	s.writtenSince.Add(-w0)
	return d
}

// dirUsage returns the allocated bytes of the regular files under dir.
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
