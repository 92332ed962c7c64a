package daemon

import (
	"bytes"
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/client"
)

// waitUntil polls cond until it holds, failing the test after 20s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for dl := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(dl) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// expireAll ends the hold of every quarantined entry now, as if it had
// passed, and wakes run to release them.
func (q *quarantine) expireAll() {
	q.mu.Lock()
	now := time.Now()
	for i := range q.entries {
		q.entries[i].until = now
	}
	q.mu.Unlock()
	q.signal()
}

// TestLateHostCopyCannotReachAnotherSession is the CPU case of
// TestLateDeviceCopyCannotReachAnotherSession. A CPU client writes a
// reserved host slot with its own memcpy through its mapping of the arena,
// which the client library keeps mapped while the reservation is open, even
// after the session's connection is gone. Session A reserves a slot and
// keeps its bytes; A's session ends while the process (the test) lives on,
// ended by the daemon (as a shutdown, an exit event or a protocol breach
// does) or by the client dropping its connection with a copy still under
// way; session B puts and commits blocks; then A's copy lands. B must read
// back its own bytes, and A's slot must be held until the hold ends.
func TestLateHostCopyCannotReachAnotherSession(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(r *running, sA *client.Session)
	}{
		{"daemon closed the session", func(r *running, _ *client.Session) {
			r.d.mu.Lock()
			for _, s := range r.d.sessions {
				s.stop()
			}
			r.d.mu.Unlock()
		}},
		{"client dropped its connection", func(_ *running, sA *client.Session) {
			sA.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaks := goleak.IgnoreCurrent()
			t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // after the daemon's cleanup
			const bs, nB = 64 << 10, 4
			cfg := testConfig(t)
			r := startDaemonWith(t, cfg, nil, func(d *Daemon) {
				d.quar.hold.Store(int64(time.Minute)) // ended by expireAll below
			})
			t.Cleanup(r.d.quar.expireAll) // before the daemon stops: its stop waits for the hold
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ns := testNamespace(bs)
			sA, err := dialDaemon(t, cfg).Open(ctx, ns)
			if err != nil {
				t.Fatal(err)
			}
			hA, hB := testBlocks(1, 1)[0], testBlocks(2, nB)
			rA, err := sA.Reserve(ctx, hA)
			if err != nil || rA == nil {
				t.Fatalf("A's reserve: %v, %v", rA, err)
			}
			slotA := rA.Bytes() // A's copy is still to come

			tc.end(r, sA)
			waitUntil(t, "A's session to end", func() bool {
				r.d.mu.Lock()
				defer r.d.mu.Unlock()
				return len(r.d.sessions) == 0
			})

			sB, err := dialDaemon(t, cfg).Open(ctx, ns)
			if err != nil {
				t.Fatal(err)
			}
			blocks := make([][]byte, nB)
			for i, h := range hB {
				blocks[i] = block(h, bs)
			}
			if n, err := sB.PutBatch(ctx, hB, blocks); err != nil || n != nB {
				t.Fatalf("B's put: stored %d of %d: %v", n, nB, err)
			}

			copy(slotA, block(hA, bs)) // A's late copy
			if err := rA.Commit(ctx); err == nil {
				t.Error("A's commit after its session ended succeeded")
			}

			dsts := make([][]byte, nB)
			for i := range dsts {
				dsts[i] = make([]byte, bs)
			}
			found, err := sB.GetBatch(ctx, hB, dsts)
			if err != nil {
				t.Fatalf("B's get: %v", err)
			}
			for i := range hB {
				switch {
				case !found[i]:
					t.Errorf("B's block %d lost", i)
				case bytes.Equal(dsts[i], block(hA, bs)):
					t.Errorf("B's block %d holds A's bytes: A's late copy overwrote it", i)
				case !bytes.Equal(dsts[i], blocks[i]):
					t.Errorf("B's block %d differs", i)
				}
			}
			if t.Failed() {
				return
			}

			// A's slot is held (the test's process lives on) until the hold
			// ends, then given back.
			if q, res := r.d.quar.blocks.Load(), r.d.host.Stats().Reserved; q != 1 || res != 1 {
				t.Fatalf("with A's process alive: %d quarantined, %d host reservations; want 1 and 1", q, res)
			}
			if n := r.d.quar.total.Load(); n != 1 {
				t.Errorf("quarantine total %d, want 1", n)
			}
			r.d.quar.expireAll()
			waitUntil(t, "A's slot to leave the quarantine", func() bool {
				return r.d.quar.blocks.Load() == 0 && r.d.host.Stats().Reserved == 0
			})
		})
	}
}
