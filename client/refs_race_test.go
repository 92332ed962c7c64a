package client_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// A lease granted just before the connection dies must keep its slot
// mapped until Release (doc: "their Bytes stay mapped until released").
// acquireBatch takes the lease's reference with cn.ref() after submit has
// dropped its own: if the reaper already dropped the connection's reference,
// submit's unref unmaps the arena and the ring, and the lease is built over
// unmapped memory (Bytes faults; Release writes into the unmapped ring).
func TestLeaseOfDyingConnStaysMapped(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f := newFakeDaemon(t, shm.RingLayout{Entries: 64, DataSize: 64 << 10})
	c, err := client.Dial(context.Background(), client.Options{Socket: f.sock, DialTimeout: 2 * time.Second,
		Spin: time.Second}) // the caller polls, never sleeps
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hs := client.ChainHashes(client.Hash{}, tokens(16, 11), 16)
	bad := 0
	const rounds = 200
	for i := range rounds {
		s, err := c.Open(context.Background(), testNS())
		if err != nil {
			t.Fatal(err)
		}
		ring := <-f.sess
		type result struct {
			ls  []*client.Lease
			err error
		}
		ch := make(chan result, 1)
		go func() {
			ls, err := s.AcquireBatch(context.Background(), hs)
			ch <- result{ls, err}
		}()
		e := popN(t, ring, 1)[0]
		ring.DaemonPush([]shm.CQE{{UserData: e.UserData, Status: shm.StatusOK, Value: 1, Offset: 0, Tier: shm.TierHost}})
		client.DispatchThenKill(s)
		res := <-ch
		if res.err != nil || res.ls[0] == nil {
			t.Fatalf("round %d: acquire: %v", i, res.err)
		}
		l := res.ls[0]
		// madvise fails with ENOMEM on a range that is not mapped.
		if err := unix.Madvise(l.Bytes(), unix.MADV_NORMAL); err != nil {
			bad++
			t.Errorf("round %d: the lease's Bytes are not mapped (madvise: %v)", i, err)
			// Release would write into the unmapped ring: leave it.
		} else {
			l.Release()
		}
		s.Close()
	}
	t.Logf("%d of %d rounds handed out a lease over unmapped memory", bad, rounds)
}
