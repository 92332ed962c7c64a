//go:build !cuda

package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
)

// stalledDevRig opens a session on a fake daemon with the emulated device,
// with a device buffer of blocks blocks and a stream, all freed at the end.
func stalledDevRig(t *testing.T, blocks int) (*client.Session, *shm.Ring, cudaipc.Arena, cudaipc.Stream) {
	t.Helper()
	dev := emulatedDevice(t)
	f := newFakeDaemon(t, shm.RingLayout{Entries: 64, DataSize: 4096})
	_, s, ring := f.openWith(t, dev)
	src, err := dev.Alloc(int64(blocks * s.BlockBytes()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Free() })
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return s, ring, src, st
}

// TestCloseBoundedOnStalledCommit: Close waits for device copies in flight
// and then for their commits, which went to the daemon with no deadline (a
// commit must land even if the caller's context ends). A daemon that
// stopped answering (SIGSTOP, a hung disk) held the engine's Close for
// good. The copies are still waited for; the commits' answers only up to
// closeAnswerWait, after which the put ends with the connection's error.
func TestCloseBoundedOnStalledCommit(t *testing.T) {
	defer client.SetCloseAnswerWait(200 * time.Millisecond)()
	s, ring, src, st := stalledDevRig(t, 1)
	ctx := context.Background()
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

// TestResumeCopiedIsNotAnError: Resume copied the parked blocks into the
// caller's buffers and then deleted the parked copies, waiting for the
// deletes' answers with the caller's context: a context that ended there
// (a daemon slow to answer) turned a resume whose blocks were delivered
// into an error, and the engine recomputed the request. The deletes now go
// behind the releases unanswered, in ring order.
func TestResumeCopiedIsNotAnError(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 64, DataSize: 4096})
	_, s, ring := f.open(t)
	const n = 3
	granted := make(chan struct{})
	go func() {
		defer close(granted)
		// Grant the acquires (host slots) and answer nothing after.
		es := popN(t, ring, n)
		cs := make([]shm.CQE, n)
		for i, e := range es {
			cs[i] = shm.CQE{UserData: e.UserData, Status: shm.StatusOK, Value: uint64(i + 1), Offset: uint64(i * s.BlockBytes()), Tier: shm.TierHost}
		}
		ring.DaemonPush(cs)
	}()
	dsts := make([][]byte, n)
	for i := range dsts {
		dsts[i] = bytes.Repeat([]byte{0xff}, s.BlockBytes())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Resume(ctx, 7, dsts); err != nil {
		t.Fatalf("resume whose blocks were copied (the daemon does not answer the deletes): %v", err)
	}
	for i, d := range dsts {
		if !bytes.Equal(d, make([]byte, len(d))) {
			t.Fatalf("block %d not copied from its slot", i)
		}
	}
	// The releases, then the deletes of the parked copies, reached the ring.
	<-granted
	es := popN(t, ring, 2*n)
	for i, e := range es {
		want := shm.OpRelease
		if i >= n {
			want = shm.OpDelete
		}
		if e.Op != want || (want == shm.OpDelete && e.Flags&shm.SQEFlagParked == 0) {
			t.Fatalf("entry %d after the acquires: %v flags %#x, want %v", i, e.Op, e.Flags, want)
		}
	}
}

// TestCloseBoundedOnStalledCommitOfEarlierOp: two device puts on one stream,
// the daemon answers neither commit. The stream's completer finished the
// first op inline (its commit waits for the answer with no deadline) before
// it waited for the second op's event, so the second op's copies were never
// counted done: Close, which waits for every copy before it bounds the wait
// for answers, waited for good.
func TestCloseBoundedOnStalledCommitOfEarlierOp(t *testing.T) {
	defer client.SetCloseAnswerWait(200 * time.Millisecond)()
	s, ring, src, st := stalledDevRig(t, 2)
	ctx := context.Background()
	// Held until both puts are queued: the first one's commit must not
	// reach the ring before the second one's reserve.
	release := hold(t, st)
	// The fake grants both reservations (host slots 0 and 1) and answers
	// nothing after them.
	granted := make(chan error, 1)
	go func() {
		for i := range 2 {
			es := popN(t, ring, 1)
			if es[0].Op != shm.OpReserve {
				granted <- fmt.Errorf("entry %d is %v, not a reserve", i, es[0].Op)
				return
			}
			ring.DaemonPush([]shm.CQE{{UserData: es[0].UserData, Status: shm.StatusOK, Value: uint64(i + 1),
				Offset: uint64(i * s.BlockBytes()), Tier: shm.TierHost}})
		}
		granted <- nil
	}()
	var ops []*client.DeviceOp
	for i := range 2 {
		op, err := s.PutFromDeviceAsync(ctx, client.Hash{Hi: 1, Lo: uint64(i)}, src.Ptr()+cudaipc.DevicePtr(i*s.BlockBytes()), st)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
	release()
	commit := popN(t, ring, 1)[0] // the first op's, sent once its copy is done
	done, ok := returnsWithin(10*time.Second, func() { s.Close() })
	if !ok {
		// Answer the commits after all, so that Close and the cleanups return.
		ring.DaemonPush([]shm.CQE{{UserData: commit.UserData, Status: shm.StatusOK}})
		second := popN(t, ring, 1)[0]
		ring.DaemonPush([]shm.CQE{{UserData: second.UserData, Status: shm.StatusOK}})
		<-done
		t.Fatal("Session.Close still waiting 10s after the daemon stopped answering: the first device put's commit held the second put's copies")
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for i, op := range ops {
		if err := op.Wait(wctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("device put %d whose commit was never answered: %v, want the connection's error", i, err)
		}
	}
}

// TestCloseBoundedOnStalledDeviceReserve: a device put counts as copies in
// flight from its start, before its reserve is answered, and Close waits
// for copies in flight without a bound before it ends the connection. A
// daemon that stopped answering the reserve of a put whose context has no
// deadline held Close for good.
func TestCloseBoundedOnStalledDeviceReserve(t *testing.T) {
	defer client.SetCloseAnswerWait(200 * time.Millisecond)()
	s, ring, src, st := stalledDevRig(t, 1)
	put := make(chan error, 1)
	go func() {
		_, err := s.PutFromDeviceAsync(context.Background(), client.Hash{Hi: 1, Lo: 2}, src.Ptr(), st)
		put <- err
	}()
	reserve := popN(t, ring, 1)[0] // never answered
	done, ok := returnsWithin(10*time.Second, func() { s.Close() })
	if !ok {
		ring.DaemonPush([]shm.CQE{{UserData: reserve.UserData, Status: shm.StatusFull}})
		<-done
		<-put
		t.Fatal("Session.Close still waiting 10s after the daemon stopped answering a device put's reserve")
	}
	select {
	case err := <-put:
		if err == nil {
			t.Fatal("device put whose reserve was never answered succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("device put still waiting 5s after Close")
	}
}
