//go:build !cuda

package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// TestCloseBoundedOnStalledCommit: Close waits for device copies in flight
// and then for their commits, which went to the daemon with no deadline (a
// commit must land even if the caller's context ends). A daemon that
// stopped answering (SIGSTOP, a hung disk) held the engine's Close for
// good. The copies are still waited for; the commits' answers only up to
// closeAnswerWait, after which the put ends with the connection's error.
func TestCloseBoundedOnStalledCommit(t *testing.T) {
	defer client.SetCloseAnswerWait(200 * time.Millisecond)()
	dev := emulatedDevice(t)
	f := newFakeDaemon(t, shm.RingLayout{Entries: 64, DataSize: 4096})
	_, s, ring := f.openWith(t, dev)
	ctx := context.Background()
	src, err := dev.Alloc(int64(s.BlockBytes()))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// The fake grants the reservation (a host slot) and answers nothing
	// after it: the commit waits.
	granted := make(chan error, 1)
	go func() {
		es := popN(t, ring, 1)
		if es[0].Op != shm.OpReserve {
			granted <- errors.New("first entry is not a reserve")
			return
		}
		ring.DaemonPush([]shm.CQE{{UserData: es[0].UserData, Status: shm.StatusOK, Value: 1, Offset: 0, Tier: shm.TierHost}})
		granted <- nil
	}()
	op, err := s.PutFromDeviceAsync(ctx, client.Hash{Hi: 1, Lo: 2}, src.Ptr(), st)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
	commit := popN(t, ring, 1)[0] // sent once the copy is done
	done, ok := returnsWithin(10*time.Second, func() { s.Close() })
	if !ok {
		// Answer it after all, so that Close and the cleanups return.
		ring.DaemonPush([]shm.CQE{{UserData: commit.UserData, Status: shm.StatusOK}})
		<-done
		t.Fatal("Session.Close still waiting 10s after the daemon stopped answering a device put's commit")
	}
	<-done
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := op.Wait(wctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("device put whose commit was never answered: %v, want the connection's error", err)
	}
}
