package nvme

import (
	"path/filepath"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

// tombstonesOf counts the deletion markers badger holds for k: every
// version, so each tombstone written since the last compaction counts
// (a small test's writes all sit in the memtable).
func tombstonesOf(t *testing.T, s *Store, k Key) int {
	t.Helper()
	var kb [keyLen]byte
	encodeKey(&kb, k)
	n := 0
	err := s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.AllVersions = true
		opts.PrefetchValues = false
		opts.Prefix = kb[:]
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if it.Item().IsDeletedOrExpired() {
				n++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHiddenDeleteWritesEachTombstoneOnce: the deleter, removing a block a
// Delete hid, writes no tombstone of its own when the block's deletion is
// logged already (by the Delete itself, or by the write that held the
// stripe, after its commit): one badger write per deletion, not two.
func TestHiddenDeleteWritesEachTombstoneOnce(t *testing.T) {
	const size = 64 << 10
	for _, tc := range []struct {
		name string
		// hide hides the deleted key while the stripe is busy, lets the
		// busy operation finish, and returns the key.
		hide func(t *testing.T, s *Store) Key
		want int // tombstones: the Delete's and the relogs of records committed after it
	}{
		{
			name: "another block's write",
			hide: func(t *testing.T, s *Store) Key {
				a := testKey(11, 0)
				b := sameStripe(11, a)
				for _, k := range []Key{a, b} {
					if err := s.Put(k, payloadFor(k, size)); err != nil {
						t.Fatal(err)
					}
				}
				entered, release := blockAt(s, "put")
				putDone := make(chan error, 1)
				go func() { putDone <- s.Put(a, payloadFor(a, size)) }()
				<-entered
				if err := s.Delete(b); err != nil {
					t.Error(err)
				}
				close(release)
				if err := <-putDone; err != nil {
					t.Fatal(err)
				}
				return b
			},
			want: 1,
		},
		{
			name: "its own write",
			hide: func(t *testing.T, s *Store) Key {
				k := testKey(12, 0)
				entered, release := blockAt(s, "put")
				putDone := make(chan error, 1)
				go func() { putDone <- s.Put(k, payloadFor(k, size)) }()
				<-entered
				if err := s.Delete(k); err != nil {
					t.Error(err)
				}
				close(release)
				if err := <-putDone; err != nil {
					t.Fatal(err)
				}
				return k
			},
			want: 1, // the write's relog; the Delete found nothing stored
		},
		{
			name: "a relocation",
			hide: func(t *testing.T, s *Store) Key {
				k := testKey(13, 0)
				if err := s.Put(k, payloadFor(k, size)); err != nil {
					t.Fatal(err)
				}
				s.mu.Lock()
				i, _ := s.idx.get(k)
				from := s.idx.ents[i].seg
				s.mu.Unlock()
				entered, release := blockAt(s, "move")
				moved := make(chan struct{})
				go func() {
					defer close(moved)
					var buf *[]byte
					s.relocate(k, from, &buf)
					if buf != nil {
						s.segs.putBuf(buf)
					}
				}()
				<-entered
				if err := s.Delete(k); err != nil {
					t.Error(err)
				}
				close(release)
				<-moved
				return k
			},
			want: 2, // the Delete's, and the move's relog after its record
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "nvme")
			s := openT(t, dir, 256<<20)
			defer s.Close()
			k := tc.hide(t, s)
			waitNoHidden(t, s)
			if s.Contains(k) {
				t.Fatal("the deleted block is still stored")
			}
			if got := tombstonesOf(t, s, k); got != tc.want {
				t.Fatalf("badger holds %d tombstones of the deleted block, want %d (the deleter logged its deletion again)", got, tc.want)
			}
		})
	}
}
