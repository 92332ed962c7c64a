package client_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// A control call (Stats, Evict, Flush) whose context is cancelled while the
// daemon works on it (or is stopped) returns with the context's error; it
// used to wait for the reply up to DialTimeout, or Flush's two minutes.
func TestAdminCallCancelled(t *testing.T) {
	f := newFakeDaemon(t, shm.RingLayout{Entries: 8, DataSize: 64 << 10})
	got := make(chan struct{}, 1)
	serve := func(uc *net.UnixConn) {
		if _, _, err := shm.RecvMsg(uc, make([]byte, shm.MaxControlMsg), 0); err != nil {
			return // Dial's check: closed after the Welcome
		}
		got <- struct{}{}
		// Never answers; returns once the client hangs up.
		shm.RecvMsg(uc, make([]byte, shm.MaxControlMsg), 0)
	}
	f.admin.Store(&serve)
	c, err := client.Dial(context.Background(), client.Options{Socket: f.sock, DialTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Stats", func(ctx context.Context) error { _, err := c.Stats(ctx); return err }},
		{"Evict", func(ctx context.Context) error { _, err := c.Evict(ctx, 1, false); return err }},
		{"Flush", func(ctx context.Context) error { _, err := c.Flush(ctx); return err }},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-got // the daemon has the request
			cancel()
		}()
		var err error
		done, ok := returnsWithin(hangBound, func() { err = tc.call(ctx) })
		if !ok {
			f.dropConns() // unblocks it
			<-done
			t.Fatalf("%s still blocked %v after its context was cancelled (DialTimeout 1h); after the daemon hung up: %v", tc.name, hangBound, err)
		}
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s cancelled while the daemon works: %v, want context.Canceled", tc.name, err)
		}
	}
}
