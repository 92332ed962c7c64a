package nvme

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"
)

// readRunBytes bounds one coalesced read of GetBatch. Direct reads of
// 64 KiB ran at 368 MB/s from one reader on the development VM, of 1 MiB at
// 1.2 GB/s (dd iflag=direct, docs/benchmarks.md "Batched promotion"): past
// about 1 MiB a larger read gains nothing and only delays the first block.
const readRunBytes = 1 << 20

// GetBatch reads the block of each keys[i] into dsts[i] and returns, for
// each, what Get would: the payload length and nil, ErrNotFound (a miss,
// also for a block that fails verification), ErrShortBuffer with the
// needed length, or another error. Records that lie back to back in a
// segment are read with one preadv of up to readRunBytes: the mover
// writes a run of blocks with one write, and a prefix promoted together
// was often demoted together. Every block is verified as Get verifies it;
// anything the batched path does not take at face value (a record that
// disagrees with the index, a segment compaction removed, a failed
// checksum, a buffer direct I/O cannot use) is read again alone by Get,
// which owns the handling of those cases.
func (s *Store) GetBatch(keys []Key, dsts [][]byte) ([]int, []error) {
	ns, errs := make([]int, len(keys)), make([]error, len(keys))
	if len(dsts) != len(keys) {
		err := fmt.Errorf("nvme: GetBatch of %d keys into %d buffers", len(keys), len(dsts))
		for i := range errs {
			errs[i] = err
		}
		return ns, errs
	}
	slow, err := s.getBatch(keys, dsts, ns, errs)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return ns, errs
	}
	for _, i := range slow {
		ns[i], errs[i] = s.Get(keys[i], dsts[i])
	}
	return ns, errs
}

// pendingRead is one block of a GetBatch on the batched path.
type pendingRead struct {
	i   int // index into the batch
	kb  [keyLen]byte
	rec record
}

// getBatch serves what it can of a GetBatch with coalesced reads, fills
// ns and errs for those blocks and for index misses, and returns the
// indexes left for Get. It holds the store open (enter) only while it
// runs, so that the caller's Gets may take it again.
func (s *Store) getBatch(keys []Key, dsts [][]byte, ns []int, errs []error) (slow []int, err error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.exit()
	var reads []pendingRead
	sizes := make([]int64, len(keys))
	s.mu.Lock()
	for i, k := range keys {
		j, ok := s.idx.get(k)
		if !ok || s.isHiddenLocked(k) {
			errs[i] = ErrNotFound
			s.misses.Add(1)
			continue
		}
		sizes[i] = s.idx.ents[j].size
		s.idx.touch(j)
		if int64(len(dsts[i])) < sizes[i] {
			ns[i], errs[i] = int(sizes[i]), ErrShortBuffer
			continue
		}
		reads = append(reads, pendingRead{i: i})
	}
	s.mu.Unlock()
	if len(reads) == 0 {
		return nil, nil
	}

	// Index records, all in one read transaction.
	fast := make([]pendingRead, 0, len(reads))
	err = s.db.View(func(txn *badger.Txn) error {
		for _, r := range reads {
			encodeKey(&r.kb, keys[r.i])
			item, err := txn.Get(r.kb[:])
			ok := false
			if err == nil {
				err = item.Value(func(v []byte) error {
					r.rec, ok = decodeRecord(v)
					return nil
				})
			}
			if err != nil || !ok || r.rec.n != sizes[r.i] {
				slow = append(slow, r.i)
				continue
			}
			fast = append(fast, r)
		}
		return nil
	})
	if err != nil {
		// The transaction itself failed (the store is closing): Get
		// reports it per block.
		for _, r := range reads {
			slow = append(slow, r.i)
		}
		return slow, nil
	}

	slices.SortFunc(fast, func(a, b pendingRead) int {
		return cmp.Or(cmp.Compare(a.rec.seg, b.rec.seg), cmp.Compare(a.rec.offset, b.rec.offset))
	})
	for len(fast) > 0 {
		n := 1
		for n < len(fast) && fast[n].rec.seg == fast[0].rec.seg {
			n++
		}
		slow = s.readSegment(fast[:n], dsts, ns, slow)
		fast = fast[n:]
	}
	return slow, nil
}

// readSegment reads rs (records of one segment, by offset) into their
// buffers in runs of back-to-back records, verifies each, and returns slow
// with the indexes of those it could not serve appended.
func (s *Store) readSegment(rs []pendingRead, dsts [][]byte, ns []int, slow []int) []int {
	ss := s.segs
	sg := ss.get(rs[0].rec.seg)
	if sg != nil {
		sg.mu.RLock()
		defer sg.mu.RUnlock()
	}
	if sg == nil || sg.closed { // removed by compaction: Get looks the records up again
		for _, r := range rs {
			slow = append(slow, r.i)
		}
		return slow
	}
	var run []pendingRead
	var bufs [][]byte
	var runBytes int64
	flush := func() {
		if len(run) == 0 {
			return
		}
		ss.reads.Add(1)
		if err := readvAt(sg.f, bufs, run[0].rec.offset); err != nil {
			for _, r := range run {
				slow = append(slow, r.i) // Get reports or retries it
			}
		} else {
			for _, r := range run {
				n := r.rec.n
				if !r.rec.verify(&r.kb, dsts[r.i][:n]) {
					slow = append(slow, r.i) // Get counts the miss and drops the block
					continue
				}
				ns[r.i] = int(n)
				s.hits.Add(1)
			}
		}
		run, bufs, runBytes = run[:0], bufs[:0], 0
	}
	for _, r := range rs {
		off, n := r.rec.offset, r.rec.n
		// The batched path takes only records that fill their on-disk
		// length (no padding to skip), lie within the segment as written,
		// and, on a direct file, land in a buffer direct I/O can use.
		if n == 0 || n != ss.recLen(n) || !ss.within(sg, off, n) || (sg.direct && !ss.aligned(dsts[r.i])) {
			flush()
			slow = append(slow, r.i)
			continue
		}
		if len(run) > 0 {
			last := run[len(run)-1].rec
			if last.offset+last.n != off || runBytes+n > readRunBytes {
				flush()
			}
		}
		run = append(run, r)
		bufs = append(bufs, dsts[r.i][:n])
		runBytes += n
	}
	flush()
	return slow
}
