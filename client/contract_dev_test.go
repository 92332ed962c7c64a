//go:build !cuda

package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
)

// A second Close (Client.Close, or Session.Close from another goroutine)
// while the first waits for device copies in flight must wait too: Client
// Close closes the client's GPU and events after its sessions, and a caller
// frees the buffers the copies read once Close returned.
func TestCloseRacingCloseWaitsForDeviceOps(t *testing.T) {
	for _, second := range []string{"Session.Close", "Client.Close"} {
		t.Run(second, func(t *testing.T) {
			r := newDevRig(t, 2)
			st := r.stream(t)
			release := hold(t, st)
			op, err := r.s.PutFromDeviceAsync(context.Background(), r.hs[0], r.src(0), st)
			if err != nil {
				t.Fatal(err)
			}
			first := make(chan struct{})
			go func() {
				defer close(first)
				r.s.Close()
			}()
			// Wait until the first Close has begun (new calls fail).
			deadline := time.Now().Add(5 * time.Second)
			for !errors.Is(r.s.Nop(context.Background()), client.ErrClosed) {
				if time.Now().After(deadline) {
					t.Fatal("the session never closed")
				}
				time.Sleep(time.Millisecond)
			}
			done, ok := returnsWithin(200*time.Millisecond, func() {
				if second == "Session.Close" {
					r.s.Close()
				} else {
					r.c.Close()
				}
			})
			stillPending := pending(op)
			release()
			<-first
			<-done
			if ok && stillPending {
				t.Fatalf("%s returned while a device copy of the session was still in flight", second)
			}
			if err := op.Err(); err != nil || op.Stored() != 1 {
				t.Fatalf("op in flight at Close: %v, stored %d", err, op.Stored())
			}
		})
	}
}
