package tiers

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// TestParkTTLSurvivesRestart: a parked block's TTL runs from its Park, not
// from the last start. A restarted daemon used to give every parked block
// it found (in NVMe, or in a warm restart's host arena) a fresh TTL, so a
// daemon restarted more often than park_ttl_s (upgrades, a crash loop)
// never expired the blocks of a client gone for good, and parked blocks
// are unevictable in NVMe.
func TestParkTTLSurvivesRestart(t *testing.T) {
	const ttl = time.Hour
	const bs = 64 << 10
	k := Key{NS: 3 | ParkedNS, Hash: shm.Hash{Hi: 77, Lo: 1}}
	tests := []struct {
		name string
		left time.Duration // of its TTL when the first daemon stops
		host bool          // the block is in the host tier (a warm restart re-parks it) rather than NVMe
		// want is the remaining TTL after the restart (clamped to
		// [0, ttl]: a clock stepped back does not lengthen it).
		want time.Duration
	}{
		{name: "in nvme", left: 2 * time.Minute, want: 2 * time.Minute},
		{name: "in the host arena (warm restart)", left: 2 * time.Minute, host: true, want: 2 * time.Minute},
		{name: "expired while down", left: -time.Minute, want: 0},
		{name: "clock stepped back: at most the TTL", left: 10 * time.Hour, want: ttl},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			state := filepath.Join(dir, "parked.expiry")
			cfg := ChainConfig{ParkTTL: ttl, ParkStatePath: state, Logger: discardLogger()}
			open := func() (*Chain, *Host, *nvme.Store) {
				h, err := NewHost(make([]byte, 4<<20), HostConfig{SlabBytes: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				st, err := nvme.Open(context.Background(), nvme.Options{
					Dir: filepath.Join(dir, "nvme"), CapacityBytes: nvme.MinCapacity, Logger: discardLogger(),
					Unevictable: func(k nvme.Key) bool { return k.NS&ParkedNS != 0 },
				})
				if err != nil {
					t.Fatal(err)
				}
				c, err := NewChain(h, st, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return c, h, st
			}

			// The first daemon: k parked, in NVMe, with tt.left of its TTL.
			c1, _, st1 := open()
			block := make([]byte, bs)
			fillFor(block, k)
			if err := st1.Put(nk(k), block); err != nil {
				t.Fatal(err)
			}
			c1.Park(k) // not in the host tier: recorded as held by NVMe
			c1.parkMu.Lock()
			c1.parked[k] = time.Now().Add(tt.left)
			c1.parkMu.Unlock()
			c1.Wait() // the stop: no need to have started
			if err := st1.Close(); err != nil {
				t.Fatal(err)
			}

			// The next one.
			c, h, st := open()
			defer st.Close()
			if _, err := os.Stat(state); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("stored expiries left after they were read (err %v): a crash later would apply them again", err)
			}
			if tt.host {
				// The block adopted from a kept arena, re-parked before Start.
				if err := st.Delete(nk(k)); err != nil {
					t.Fatal(err)
				}
				hd, err := c.Reserve(k, bs)
				if err != nil {
					t.Fatal(err)
				}
				fillFor(h.Bytes(hd), k)
				if err := h.Commit(hd); err != nil {
					t.Fatal(err)
				}
				c.Park(k)
			}
			read := make(chan struct{})
			c.expireHook = func(Key) { <-read } // an expired block stays until it was seen
			ctx, cancel := context.WithCancel(context.Background())
			defer func() { cancel(); c.Wait() }()
			now := time.Now()
			c.Start(ctx)
			c.parkMu.Lock()
			exp, ok := c.parked[k]
			c.parkMu.Unlock()
			close(read)
			if !ok {
				t.Fatal("parked block not recorded after the restart")
			}
			// A bound, not a timing: the restart itself takes well under
			// the minute of slack.
			if got := exp.Sub(now); got > tt.want+time.Minute/2 || got < tt.want-time.Minute/2 {
				t.Errorf("after the restart the parked block expires in %v, want %v (it had %v left)", got.Round(time.Second), tt.want, tt.left)
			}
		})
	}
}

// TestParkStateCorruptIgnored: an unreadable expiry file gives the blocks a
// fresh TTL (the old behavior) and is removed.
func TestParkStateCorruptIgnored(t *testing.T) {
	for _, data := range [][]byte{nil, []byte("KVPARK01garbage-garbage-garbage"), make([]byte, 64)} {
		if _, err := decodeParkState(data, time.Now(), time.Hour); err == nil {
			t.Errorf("decodeParkState(%q) accepted", data)
		}
	}
}
