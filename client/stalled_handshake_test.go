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
