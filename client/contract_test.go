package client_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
)

// A commit whose context ends while the submission ring is full (a daemon
// that stopped taking entries for a while) never reaches the daemon. The
// reservation is finished for the caller (ErrDone from then on), so the
// client must still give its slot back once the daemon takes entries again:
// otherwise the slot stays reserved, and its hash unputtable, until the
// session ends.
func TestFinishNotPushedGivesReservationBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		finish func(context.Context, *client.Session, *client.Reservation) error
	}{
		{"Commit", func(ctx context.Context, _ *client.Session, r *client.Reservation) error { return r.Commit(ctx) }},
		{"Abort", func(ctx context.Context, _ *client.Session, r *client.Reservation) error { return r.Abort(ctx) }},
		{"CommitBatch", func(ctx context.Context, s *client.Session, r *client.Reservation) error {
			return s.CommitBatch(ctx, []*client.Reservation{r})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const entries = 8
			f := newFakeDaemon(t, shm.RingLayout{Entries: entries, DataSize: 64 << 10})
			_, s, ring := f.open(t)
			const token = 77
			served := make(chan struct{}) // the test pops the ring after this goroutine
			go func() {
				defer close(served)
				e := popN(t, ring, 1)[0]
				ring.DaemonPush([]shm.CQE{{UserData: e.UserData, Status: shm.StatusOK, Value: token, Offset: 0, Tier: shm.TierHost}})
			}()
			h := client.ChainHashes(client.Hash{}, tokens(16, 11), 16)[0]
			r, err := s.Reserve(context.Background(), h)
			if err != nil || r == nil {
				t.Fatal(r, err)
			}
			// The daemon stalls: fill the submission ring.
			for i := range entries {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				err := s.Nop(ctx)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("nop %d: %v", i, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			err = tc.finish(ctx, s, r)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s on a full ring: %v", tc.name, err)
			}
			if err := r.Abort(context.Background()); !errors.Is(err, client.ErrDone) {
				t.Fatalf("abort after the failed %s: %v, want ErrDone", tc.name, err)
			}
			<-served
			// The daemon takes entries again: the reservation must come back
			// to it (committed or aborted).
			deadline := time.Now().Add(2 * time.Second)
			var buf [entries]shm.SQE
			for time.Now().Before(deadline) {
				n, err := ring.DaemonPop(buf[:])
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range buf[:n] {
					if (e.Op == shm.OpCommit || e.Op == shm.OpAbort) && e.Token == token {
						return
					}
				}
				ring.DaemonWait(0, time.Millisecond)
			}
			t.Fatalf("reservation (token %d) neither committed nor aborted 2s after the daemon resumed: held until the session ends", token)
		})
	}
}

// PutBatch returns how many blocks were stored: when the daemon refuses
// one commit of the batch, the others were still stored and count.
func TestPutBatchCountsCommitsOnPartialFailure(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 64, DataSize: 64 << 10})
	_, s, ring := f.open(t)
	go func() {
		es := popN(t, ring, 3)
		ring.DaemonPush([]shm.CQE{
			{UserData: es[0].UserData, Status: shm.StatusOK, Value: 1, Offset: 0, Tier: shm.TierHost},
			{UserData: es[1].UserData, Status: shm.StatusOK, Value: 2, Offset: 8192, Tier: shm.TierHost},
			{UserData: es[2].UserData, Status: shm.StatusOK, Value: 3, Offset: 16384, Tier: shm.TierHost},
		})
		es = popN(t, ring, 3)
		cqes := make([]shm.CQE, len(es))
		for i, e := range es {
			cqes[i] = shm.CQE{UserData: e.UserData, Status: shm.StatusOK}
			if e.Token == 2 {
				cqes[i].Status = shm.StatusInternal
			}
		}
		ring.DaemonPush(cqes)
	}()
	hs := client.ChainHashes(client.Hash{}, tokens(3*16, 12), 16)
	blocks := [][]byte{make([]byte, 8192), make([]byte, 8192), make([]byte, 8192)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := s.PutBatch(ctx, hs, blocks)
	if err == nil {
		t.Fatal("put batch with a refused commit succeeded")
	}
	if n != 2 {
		t.Fatalf("put batch: %d stored (%v), want the 2 whose commits the daemon accepted", n, err)
	}
}

// A Park whose commits fail midway (here its context ends while the daemon
// has answered one of two commits) returns an error; it must not leave
// the request half parked: a retry of the Park would fail with ErrParked
// and a Resume with ErrNotFound, and the committed blocks would hold
// unevictable disk until the TTL. The client drops what it committed.
func TestParkFailedCommitLeavesNothingParked(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 64, DataSize: 64 << 10})
	_, s, ring := f.open(t)
	const req = 4711
	deleted := make(chan shm.Hash, 8)
	go func() {
		defer close(deleted)
		es := popN(t, ring, 2)
		ring.DaemonPush([]shm.CQE{
			{UserData: es[0].UserData, Status: shm.StatusOK, Value: 1, Offset: 0, Tier: shm.TierHost},
			{UserData: es[1].UserData, Status: shm.StatusOK, Value: 2, Offset: 8192, Tier: shm.TierHost},
		})
		es = popN(t, ring, 2)
		for _, e := range es {
			if e.Token == 1 { // the other commit is never answered
				ring.DaemonPush([]shm.CQE{{UserData: e.UserData, Status: shm.StatusOK}})
			}
		}
		deadline := time.Now().Add(2 * time.Second)
		var buf [8]shm.SQE
		for seen := 0; seen < 2 && time.Now().Before(deadline); {
			n, _ := ring.DaemonPop(buf[:])
			for _, e := range buf[:n] {
				if e.Op == shm.OpDelete && e.Flags&shm.SQEFlagParked != 0 {
					deleted <- e.Hash
					seen++
				}
			}
			ring.DaemonWait(0, time.Millisecond)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := s.Park(ctx, req, [][]byte{make([]byte, 8192), make([]byte, 8192)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("park with an unanswered commit: %v", err)
	}
	got := map[shm.Hash]bool{}
	for h := range deleted {
		got[h] = true
	}
	for i := range 2 {
		if h := (shm.Hash{Hi: req, Lo: uint64(i)}); !got[h] {
			t.Errorf("parked block %d of the failed Park was never dropped (deleted: %v)", i, got)
		}
	}
}

// The deletes a failed Park sends must reach the daemon before the caller's
// next entries: a retry of the Park right after the error would otherwise
// have its reservations answered "exists" by the failed attempt's blocks,
// or its new blocks dropped by those deletes arriving late. Sent from a
// goroutine of their own, they raced the retry.
func TestFailedParkDeletesPrecedeRetry(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 64, DataSize: 64 << 10})
	_, s, ring := f.open(t)
	const rounds = 40
	order := make(chan []shm.Op, rounds)
	// The fake daemon's ring stays mapped until its goroutine is done.
	t.Cleanup(func() {
		for range order {
		}
	})
	go func() {
		defer close(order)
		var buf [16]shm.SQE
		for r := 0; r < rounds; r++ {
			// The failing Park: two reserves granted, two commits refused.
			es := popN(t, ring, 2)
			ring.DaemonPush([]shm.CQE{
				{UserData: es[0].UserData, Status: shm.StatusOK, Value: 1, Offset: 0, Tier: shm.TierHost},
				{UserData: es[1].UserData, Status: shm.StatusOK, Value: 2, Offset: 8192, Tier: shm.TierHost},
			})
			es = popN(t, ring, 2)
			ring.DaemonPush([]shm.CQE{
				{UserData: es[0].UserData, Status: shm.StatusInternal},
				{UserData: es[1].UserData, Status: shm.StatusInternal},
			})
			// Then the drops and the retry's two reserves, in ring order.
			var ops []shm.Op
			var reserves []shm.SQE
			deadline := time.Now().Add(5 * time.Second)
			for len(reserves) < 2 && time.Now().Before(deadline) {
				n, _ := ring.DaemonPop(buf[:])
				for _, e := range buf[:n] {
					ops = append(ops, e.Op)
					switch e.Op {
					case shm.OpReserve:
						reserves = append(reserves, e)
					case shm.OpDelete:
						ring.DaemonPush([]shm.CQE{{UserData: e.UserData, Status: shm.StatusOK}})
					}
				}
				if n == 0 {
					ring.DaemonWait(0, time.Millisecond)
				}
			}
			order <- ops
			// The retry: granted and committed.
			cq := make([]shm.CQE, len(reserves))
			for i, e := range reserves {
				cq[i] = shm.CQE{UserData: e.UserData, Status: shm.StatusOK, Value: uint64(3 + i), Offset: uint64(i) * 8192, Tier: shm.TierHost}
			}
			ring.DaemonPush(cq)
			es = popN(t, ring, 2)
			ring.DaemonPush([]shm.CQE{
				{UserData: es[0].UserData, Status: shm.StatusOK},
				{UserData: es[1].UserData, Status: shm.StatusOK},
			})
		}
	}()
	blocks := [][]byte{make([]byte, 8192), make([]byte, 8192)}
	for r := 0; r < rounds; r++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.Park(ctx, uint64(100+r), blocks); err == nil {
			t.Fatalf("round %d: park with refused commits succeeded", r)
		}
		if err := s.Park(ctx, uint64(100+r), blocks); err != nil {
			t.Fatalf("round %d: retried park: %v", r, err)
		}
		cancel()
		ops := <-order
		want := []shm.Op{shm.OpDelete, shm.OpDelete, shm.OpReserve, shm.OpReserve}
		if !slices.Equal(ops, want) {
			t.Fatalf("round %d: after the failed park the daemon saw %v, want the drops first: %v", r, ops, want)
		}
	}
}

// Client is safe for concurrent use: two Closes at once (a shutdown path and
// a deferred Close) must close the GPU the client opened once, without a
// data race on it (run with -race).
func TestConcurrentClientCloseOwnGPU(t *testing.T) {
	sock := startDaemon(t)
	t.Setenv(cudaipc.EnvEmulatedGPUs, "1:64MiB")
	c, err := client.Dial(context.Background(), client.Options{Socket: sock, GPU: "0"})
	if err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c.Close()
		}()
	}
	close(start)
	wg.Wait()
}

// Flush writes a whole host tier down and the daemon bounds it (60 s); a
// caller whose context has no deadline waits for the daemon's answer. It
// used to be cut at DialTimeout (5 s by default, a control call's bound)
// and reported ErrDisconnected, a lost connection, while the daemon was
// still writing.
func TestFlushWaitsPastDialTimeout(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 64, DataSize: 64 << 10})
	serve := func(uc *net.UnixConn) {
		raw, _, err := shm.RecvMsg(uc, make([]byte, shm.MaxControlMsg), 0)
		if err != nil {
			return // Dial's check: closed after the Welcome
		}
		if mt, _, _, err := shm.DecodeMsg(raw); err != nil || mt != shm.MsgFlushReq {
			return
		}
		time.Sleep(300 * time.Millisecond) // a flush longer than DialTimeout
		shm.SendMsg(uc, shm.EncodeMsg(shm.MsgFlushReply, shm.ProtocolVersion, []byte(`{"blocks":7}`)))
	}
	f.admin.Store(&serve)
	c, err := client.Dial(context.Background(), client.Options{Socket: f.sock, DialTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n, err := c.Flush(context.Background())
	if err != nil || n != 7 {
		t.Fatalf("flush of 300 ms with a 100 ms DialTimeout and no deadline: %d blocks, %v; want 7, nil", n, err)
	}
}

// Release does not wait for the daemon (package doc): with the submission
// ring full (a stalled daemon), it must return, and the release reach the
// daemon once it takes entries again.
func TestReleaseOnFullRingDoesNotWait(t *testing.T) {
	const entries = 8
	f := newFakeDaemon(t, shm.RingLayout{Entries: entries, DataSize: 64 << 10})
	_, s, ring := f.open(t)
	const token = 99
	served := make(chan struct{}) // the test pops the ring after this goroutine
	go func() {
		defer close(served)
		e := popN(t, ring, 1)[0]
		ring.DaemonPush([]shm.CQE{{UserData: e.UserData, Status: shm.StatusOK, Value: token, Offset: 0, Tier: shm.TierHost}})
	}()
	h := client.ChainHashes(client.Hash{}, tokens(16, 13), 16)[0]
	l, err := s.Acquire(context.Background(), h)
	if err != nil {
		t.Fatal(err)
	}
	for i := range entries { // the daemon stalls: fill the submission ring
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		err := s.Nop(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("nop %d: %v", i, err)
		}
	}
	done, ok := returnsWithin(time.Second, func() { err = l.Release() })
	if !ok {
		s.Close() // unblocks it
		<-done
		t.Fatalf("Release blocked for 1s on a full submission ring (stalled daemon); after Close: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	<-served
	// A later call of the session still comes after the release (the
	// rings are ordered).
	later := make(chan struct{})
	go func() {
		defer close(later)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		s.Delete(ctx, h)
	}()
	defer func() { <-later }()
	deadline := time.Now().Add(2 * time.Second)
	var buf [entries]shm.SQE
	released := false
	for time.Now().Before(deadline) {
		n, err := ring.DaemonPop(buf[:])
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range buf[:n] {
			switch {
			case e.Op == shm.OpRelease && e.Token == token:
				released = true
			case e.Op == shm.OpDelete && !released:
				t.Fatal("a later call of the session reached the daemon before the release")
			case e.Op == shm.OpDelete:
				return
			}
		}
		ring.DaemonWait(0, time.Millisecond)
	}
	t.Fatalf("after the daemon took entries again: release seen %v, the later delete not seen", released)
}
