package client_test

// A daemon that stops answering mid-handshake (SIGSTOPped, wedged): the
// session's dial must end with the caller's context, and a reconnect in
// progress must not hold the session's other callers (or Close) past theirs.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// hangBound is how long a call that should return at once may take before
// the test calls it hung (the stalled dial would take an hour).
const hangBound = 5 * time.Second

func TestOpenCancelledDuringHandshake(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 8, DataSize: 64 << 10})
	stalled := make(chan struct{}, 1)
	f.stall.Store(&stalled)
	c, err := client.Dial(context.Background(), client.Options{Socket: f.sock, DialTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stalled // the daemon holds our Hello
		cancel()
	}()
	var s *client.Session
	done, ok := returnsWithin(hangBound, func() { s, err = c.Open(ctx, testNS()) })
	if !ok {
		f.stall.Store(nil)
		f.dropConns() // unblocks it
		<-done
		t.Fatalf("Open still blocked %v after its context was cancelled mid-handshake (DialTimeout 1h); after the daemon dropped it: %v", hangBound, err)
	}
	if err == nil {
		s.Close()
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Open cancelled mid-handshake: %v, want context.Canceled", err)
	}
}

// One caller reconnects to a daemon that stalls in the handshake: another
// caller's context, and Close, must not wait for that dial.
func TestReconnectStallHonoursOthers(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 8, DataSize: 64 << 10})
	c, err := client.Dial(context.Background(), client.Options{Socket: f.sock, DialTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(context.Background(), testNS())
	if err != nil {
		t.Fatal(err)
	}
	<-f.sess
	stalled := make(chan struct{}, 1)
	f.stall.Store(&stalled)
	f.dropConns() // the daemon restarts; its successor stalls in the handshake

	// A: its Nop fails with the old connection, the next one reconnects and
	// waits in the stalled handshake (its context has no end).
	aErr := make(chan error, 1)
	go func() {
		for {
			if err := s.Nop(context.Background()); !errors.Is(err, client.ErrDisconnected) {
				aErr <- err
				return
			}
		}
	}()
	<-stalled

	cases := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Nop", func(ctx context.Context) error { return s.Nop(ctx) }},
		{"Put", func(ctx context.Context) error {
			_, err := s.Put(ctx, client.Hash{Lo: 1}, make([]byte, s.BlockBytes()))
			return err
		}},
		{"Get", func(ctx context.Context) error { return s.Get(ctx, client.Hash{Lo: 1}, make([]byte, s.BlockBytes())) }},
		{"Lookup", func(ctx context.Context) error { _, err := s.Lookup(ctx, []client.Hash{{Lo: 1}}); return err }},
		{"Park", func(ctx context.Context) error { return s.Park(ctx, 7, [][]byte{make([]byte, s.BlockBytes())}) }},
		{"Resume", func(ctx context.Context) error { return s.Resume(ctx, 7, [][]byte{make([]byte, s.BlockBytes())}) }},
		{"Delete", func(ctx context.Context) error { _, err := s.Delete(ctx, client.Hash{Lo: 1}); return err }},
	}
	for _, tc := range cases {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var err error
		done, ok := returnsWithin(hangBound, func() { err = tc.call(ctx) })
		if !ok {
			f.stall.Store(nil)
			f.dropConns() // fails A's dial, which lets this call go
			<-done
			s.Close()
			<-aErr
			t.Fatalf("%s with a cancelled context still blocked after %v behind another caller's reconnect; after the dial failed: %v", tc.name, hangBound, err)
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s with a cancelled context during another caller's reconnect: %v, want context.Canceled", tc.name, err)
		}
	}

	done, ok := returnsWithin(hangBound, func() { s.Close() })
	if !ok {
		f.stall.Store(nil)
		f.dropConns()
		<-done
		<-aErr
		t.Fatalf("Close still blocked after %v behind a stalled reconnect", hangBound)
	}
	if err := <-aErr; !errors.Is(err, client.ErrClosed) {
		t.Fatalf("the reconnecting call after Close: %v, want ErrClosed", err)
	}
}
