package nvme

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestCompactionRoomCoversConcurrentPuts: runGC lets a compaction start
// when the segment's live bytes fit under the capacity, but the bytes the
// relocation goes on to write are not admitted anywhere: waitRoom keeps
// admitting Puts against the same room while the compaction copies, and
// the directory goes past the capacity until the compacted segment is
// removed.
func TestCompactionRoomCoversConcurrentPuts(t *testing.T) {
	const capacity = 128 << 20
	const blk = 512 << 10
	dir := filepath.Join(t.TempDir(), "nvme")
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: capacity, Logger: quietLogger(), GCInterval: time.Hour,
		// The blocks already stored stay (parked): the penalty of a disk
		// over its soft cap evicts none of them, which would free
		// segments meanwhile.
		Unevictable: func(k Key) bool { return k.NS == 1 }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Two full lane segments (32 blocks each), then one more block each
	// to rotate the lanes: both full segments are retired.
	var all []Key
	for i := range uint64(66) {
		k := testKey(1, i)
		all = append(all, k)
		if err := s.Put(k, payloadFor(k, blk)); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	segOf := map[Key]uint32{}
	for _, k := range all {
		segOf[k] = s.idx.ents[s.idx.m[k]].seg
	}
	s.mu.Unlock()
	var victim *segment
	for _, sg := range s.segs.snapshot() {
		if !sg.active.Load() && (victim == nil || sg.id > victim.id) {
			victim = sg
		}
	}
	if victim == nil {
		t.Fatal("no retired segment")
	}
	// A quarter of it dead: a candidate at 20%, not at 50%.
	busy := map[int]bool{}
	deleted := 0
	for _, k := range all {
		if segOf[k] != victim.id {
			continue
		}
		if deleted < 8 {
			if err := s.Delete(k); err != nil {
				t.Fatal(err)
			}
			deleted++
			continue
		}
		busy[stripeOf(k)] = true
	}
	live := victim.live.Load()
	// Fill the directory (a file in it counts in the measured usage) so
	// that the segment's live bytes just fit under the capacity.
	used := s.measure()
	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, capacity-used-live-(1<<20)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("segment %d: %d live of %d; measured %d", victim.id, live, victim.size.Load(), s.measure())

	var peakMu sync.Mutex
	var peak int64
	sample := func() {
		peakMu.Lock()
		peak = max(peak, storeUsage(dir))
		peakMu.Unlock()
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.testHook = func(p string) {
		if p != "move" {
			return
		}
		once.Do(func() { close(entered); <-release })
		sample()
	}
	done := make(chan struct{})
	go func() { defer close(done); s.runGC(context.Background(), 0.2) }()
	<-entered
	// Puts while the compaction copies, of keys its stripe locks do not
	// hold.
	puts := 0
	for i := uint64(0); i < 200; i++ {
		k := testKey(2, i)
		if busy[stripeOf(k)] {
			continue
		}
		err := s.Put(k, payloadFor(k, blk))
		if errors.Is(err, ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		puts++
		sample()
	}
	close(release)
	<-done
	sample()
	if peak > capacity {
		t.Fatalf("directory reached %d bytes, %d over the capacity %d (%d Puts admitted while a compaction of %d live bytes ran)",
			peak, peak-capacity, capacity, puts, live)
	}
	t.Logf("peak %d of %d, %d Puts", peak, capacity, puts)
}
