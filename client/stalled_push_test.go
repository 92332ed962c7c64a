package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// cpuTime is the CPU time (user + system) this process used so far.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A background push (the abort that gives back a reservation whose Commit
// timed out) waits while the daemon is stalled with a full submission ring:
// it must not burn a CPU of the engine's process meanwhile, and it must
// still land once the daemon takes submissions again.
func TestStalledDaemonBackgroundPushIdles(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 8, DataSize: 64 << 10})
	_, s, ring := f.open(t)
	hs := client.ChainHashes(client.Hash{}, tokens(16, 21), 16)
	type res struct {
		r   *client.Reservation
		err error
	}
	got := make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := s.Reserve(ctx, hs[0])
		got <- res{r, err}
	}()
	sq := popN(t, ring, 1)
	const token = 77
	ring.DaemonPush([]shm.CQE{{UserData: sq[0].UserData, Status: shm.StatusOK, Value: token}})
	rr := <-got
	if rr.err != nil || rr.r == nil {
		t.Fatalf("reserve: %v %v", rr.r, rr.err)
	}
	// The daemon stalls: fill its submission ring.
	for i := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := s.Nop(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("nop %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err := rr.r.Commit(ctx) // not pushed: its abort is left to a background push
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("commit on a full ring: %v", err)
	}
	const window = 300 * time.Millisecond
	c0, w0 := cpuTime(t), time.Now()
	time.Sleep(window)
	used, wall := cpuTime(t)-c0, time.Since(w0)
	// A sleeping process uses next to nothing; a spinning push a whole CPU
	// (or what a loaded machine lets it have).
	if used > wall/5 {
		t.Errorf("process used %v of CPU in %v while a background push waited on a stalled daemon", used, wall)
	}
	// The daemon takes submissions again: the abort arrives.
	sq = popN(t, ring, 9)
	if last := sq[8]; last.Op != shm.OpAbort || last.Token != token {
		t.Fatalf("after the stall: %+v, want the abort of token %d", last, token)
	}
}
