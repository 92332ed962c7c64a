package tiers

import (
	"cmp"
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
	const hour = time.Hour
	const bs = 64 << 10
	k := Key{NS: 3 | ParkedNS, Hash: shm.Hash{Hi: 77, Lo: 1}}
	tests := []struct {
		name string
		ttl  time.Duration // park_ttl_s; an hour if 0
		left time.Duration // of its TTL when the first daemon stops
		host bool          // the block is in the host tier (a warm restart re-parks it) rather than NVMe
		// want is the remaining TTL after the restart (clamped to
		// [0, ttl]: a clock stepped back does not lengthen it).
		want time.Duration
	}{
		{name: "in nvme", left: 2 * time.Minute, want: 2 * time.Minute},
		{name: "in the host arena (warm restart)", left: 2 * time.Minute, host: true, want: 2 * time.Minute},
		{name: "expired while down", left: -time.Minute, want: 0},
		{name: "at most the TTL", left: 10 * time.Hour, want: hour},
		// The longest park_ttl_s: an expiry as a date would be past
		// what UnixNano holds.
		{name: "290 years", ttl: 290 * 365 * 24 * time.Hour, left: 280 * 365 * 24 * time.Hour, want: 280 * 365 * 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			state := filepath.Join(dir, "parked.expiry")
			cfg := ChainConfig{ParkTTL: cmp.Or(tt.ttl, hour), ParkStatePath: state, Logger: discardLogger()}
			open := func() (*Chain, *Host, *nvme.Store) { return openParkChain(t, dir, cfg) }

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
			if _, err := os.Stat(state); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("stored expiries left after Start (err %v): a crash later would apply them again", err)
			}
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
	for _, data := range [][]byte{nil, []byte("KVPARK01garbage-garbage-garbage-garbage"), make([]byte, 64)} {
		if _, err := decodeParkState(data, time.Now(), time.Hour); err == nil {
			t.Errorf("decodeParkState(%q) accepted", data)
		}
	}
}

// TestParkStateClockSteps: the time between the stop and the start is
// read from the wall clock; a step of it while the daemon was down must
// not lengthen a TTL, and shortens it by the step at most.
func TestParkStateClockSteps(t *testing.T) {
	k := Key{NS: 1 | ParkedNS, Hash: shm.Hash{Hi: 1, Lo: 2}}
	now := time.Now()
	file := func(stop time.Time, left time.Duration) []byte {
		return encodeParkState(map[Key]time.Time{k: stop.Add(left)}, stop)
	}
	for _, tc := range []struct {
		name string
		stop time.Time // as the wall clock now reads it
		want time.Duration
	}{
		{"down 10 minutes", now.Add(-10 * time.Minute), 20 * time.Minute},
		{"down longer than the TTL left", now.Add(-2 * time.Hour), 0},
		{"clock stepped back past the stop", now.Add(3 * time.Hour), 30 * time.Minute},
	} {
		prior, err := decodeParkState(file(tc.stop, 30*time.Minute), now, time.Hour)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := prior[k].Sub(now); got != tc.want {
			t.Errorf("%s: %v left, want %v", tc.name, got, tc.want)
		}
	}
}

// FuzzDecodeParkState: the expiry file is read back at start; whatever it
// holds, decoding never panics, and what it accepts are parked blocks'
// deadlines within [now, now+TTL].
func FuzzDecodeParkState(f *testing.F) {
	now := time.Now()
	f.Add(encodeParkState(map[Key]time.Time{
		{NS: 1 | ParkedNS, Hash: shm.Hash{Hi: 1, Lo: 2}}: now.Add(time.Minute),
		{NS: 2 | ParkedNS, Hash: shm.Hash{Hi: 3, Lo: 4}}: now.Add(-time.Minute),
	}, now), int64(time.Hour))
	f.Add([]byte(parkStateMagic), int64(0))
	f.Fuzz(func(t *testing.T, data []byte, ttl int64) {
		ttl = max(ttl, 0)
		prior, err := decodeParkState(data, now, time.Duration(ttl))
		if err != nil {
			return
		}
		for k, exp := range prior {
			if !k.Parked() || exp.Before(now) || exp.After(now.Add(time.Duration(ttl))) {
				t.Fatalf("accepted %v expiring at %v (now %v, TTL %v)", k, exp, now, time.Duration(ttl))
			}
		}
	})
}

// TestParkTTLSurvivesFailedStart: a start that fails between NewChain and
// Start (a later step of the daemon's start-up errors) must leave the
// stored expiries for the next start. NewChain used to remove the file as
// it read it, so the next start gave every parked block a fresh TTL.
func TestParkTTLSurvivesFailedStart(t *testing.T) {
	const bs = 64 << 10
	const left = 2 * time.Minute
	k := Key{NS: 4 | ParkedNS, Hash: shm.Hash{Hi: 78, Lo: 1}}
	tests := []struct {
		name string
		// stopped: the failed start's chain is stopped (Wait without
		// Start) rather than abandoned: what it stores must still hold
		// the expiry of the block it never saw (in NVMe, which only
		// Start scans).
		stopped bool
	}{
		{name: "abandoned"},
		{name: "stopped without start", stopped: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			state := filepath.Join(dir, "parked.expiry")
			cfg := ChainConfig{ParkTTL: time.Hour, ParkStatePath: state, Logger: discardLogger()}
			open := func() (*Chain, *nvme.Store) {
				c, _, st := openParkChain(t, dir, cfg)
				return c, st
			}

			// The first daemon stops with k parked in NVMe, left to go.
			c1, st1 := open()
			if err := st1.Put(nk(k), blockFor(k, bs)); err != nil {
				t.Fatal(err)
			}
			c1.Park(k)
			c1.parkMu.Lock()
			c1.parked[k] = time.Now().Add(left)
			c1.parkMu.Unlock()
			c1.Wait()
			if err := st1.Close(); err != nil {
				t.Fatal(err)
			}

			// The second one fails after NewChain, before Start.
			c2, st2 := open()
			if tt.stopped {
				c2.Wait()
			}
			if err := st2.Close(); err != nil {
				t.Fatal(err)
			}

			// The third one starts.
			c, st := open()
			defer st.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer func() { cancel(); c.Wait() }()
			now := time.Now()
			c.Start(ctx)
			c.parkMu.Lock()
			exp, ok := c.parked[k]
			c.parkMu.Unlock()
			if !ok {
				t.Fatal("parked block not recorded after the restart")
			}
			if got := exp.Sub(now); got > left+time.Minute/2 || got < left-time.Minute/2 {
				t.Errorf("after a failed start and a restart the parked block expires in %v, want %v", got.Round(time.Second), left)
			}
			if _, err := os.Stat(state); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("stored expiries left after Start (err %v): a crash later would apply them again", err)
			}
		})
	}
}

// openParkChain is one daemon's start over dir: a 4 MiB host tier, the
// NVMe store in dir/nvme (parked blocks unevictable) and a chain with cfg.
// The caller closes the store.
func openParkChain(t *testing.T, dir string, cfg ChainConfig) (*Chain, *Host, *nvme.Store) {
	t.Helper()
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
