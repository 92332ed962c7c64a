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

// DispatchThenKill (TestLeaseOfDyingConnStaysMapped's interleaving) must not
// wait for its own poll to dispatch something: the caller polls the same
// ring, and when the test goroutine is preempted between the fake's answer
// and the helper's first poll (a loaded machine: the OS deschedules its
// thread, sysmon preempts it on the one P), the caller takes its own
// completion. A helper that then polls until it dispatches something spins
// forever on an empty ring and hangs the package until go test's timeout.
// Here the caller is let take it first on purpose.
func TestDispatchThenKillAfterCallerDispatched(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 64, DataSize: 64 << 10})
	c, err := client.Dial(context.Background(), client.Options{Socket: f.sock, DialTimeout: 2 * time.Second,
		Spin: time.Second}) // the caller polls, never sleeps
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(context.Background(), testNS())
	if err != nil {
		t.Fatal(err)
	}
	var ring *shm.Ring
	select {
	case ring = <-f.sess:
	case <-time.After(fakeBound):
		t.Fatalf("no ring from the fake daemon in %v", fakeBound)
	}
	hs := client.ChainHashes(client.Hash{}, tokens(16, 11), 16)
	ch := make(chan error, 1)
	go func() {
		ls, err := s.AcquireBatch(context.Background(), hs)
		if err == nil && ls[0] != nil {
			ls[0].Release()
		}
		ch <- err
	}()
	e := popN(t, ring, 1)[0]
	ring.DaemonPush([]shm.CQE{{UserData: e.UserData, Status: shm.StatusOK, Value: 1, Offset: 0, Tier: shm.TierHost}})
	select {
	case err := <-ch: // the caller dispatched its own completion
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
	case <-time.After(fakeBound):
		t.Fatalf("acquire not answered in %v", fakeBound)
	}
	done, ok := returnsWithin(5*time.Second, func() { client.DispatchThenKill(s) })
	if !ok {
		// An answer nobody waits for gives the helper something to poll.
		ring.DaemonPush([]shm.CQE{{UserData: 1 << 62, Status: shm.StatusOK}})
		<-done
		t.Fatal("DispatchThenKill still spinning after 5s: the caller had dispatched its completion itself")
	}
	s.Close()
}
