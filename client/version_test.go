package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// TestDaemonOfAnotherVersionRefused: a kvtierd of another protocol or ring
// layout version (an upgrade of the daemon under running engines, or the
// reverse) must be refused at the handshake with an error that says so.
// The client read a Welcome whatever version its header carried, and took
// a ring whose header announced another layout version, and used both as
// its own version's: fields misparsed, entries at the wrong offsets.
func TestDaemonOfAnotherVersionRefused(t *testing.T) {
	for _, tt := range []struct {
		name           string
		welcome, rings uint32
	}{
		{"welcome of a newer protocol", shm.ProtocolVersion + 1, 0},
		{"welcome of protocol version 0", 0xffff, 0},
		{"ring of a newer layout", 0, shm.RingVersion + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeDaemon(t, shm.RingLayout{Entries: 8, DataSize: 64 << 10})
			f.welcomeVersion.Store(tt.welcome)
			f.ringVersion.Store(tt.rings)
			c, err := client.Dial(context.Background(), client.Options{Socket: f.sock, DialTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := c.Open(context.Background(), testNS())
			if err == nil {
				s.Close()
				t.Fatal("session opened on a daemon of another version")
			}
			if !strings.Contains(err.Error(), "version") || errors.Is(err, client.ErrDisconnected) {
				t.Errorf("err = %v; want a version error (not ErrDisconnected, whose next call reconnects)", err)
			}
		})
	}
}
