package daemon

import (
	"log/slog"
	"os"
	"testing"

	"github.com/kvtier/kvtier/shm"
)

// TestQuarantineFDsPerProcess: every session that ends with a reservation
// open puts its reservations in the quarantine, which watches the client's
// process with a pidfd until it exits or the hold passes. One watch was
// opened per session, not per process: a single live client that opened
// and closed sessions one after another (each within session.max_sessions)
// made the daemon hold a descriptor per closed session for the whole hold,
// bounded only by how fast it could churn, until the daemon ran out of fds
// and refused everyone.
func TestQuarantineFDsPerProcess(t *testing.T) {
	const n = 64
	cfg := testConfig(t)
	cfg.Session.MaxSessions = n + 2 // quarantined sessions count against it
	r := startDaemon(t, cfg, slog.New(slog.DiscardHandler))
	t.Cleanup(r.d.quar.expireAll) // the daemon's stop waits for the hold
	fds := func() int {
		e, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(e)
	}
	f0 := fds()
	for i := range n {
		endWithReservation(t, r, rawNS("quarantine-fds", 4096), shm.Hash{Hi: 1, Lo: uint64(i)})
	}
	if q := r.d.quar.blocks.Load(); q != n {
		t.Fatalf("%d reservations quarantined, want %d", q, n)
	}
	// The test's own sockets and mappings are closed; a few fds of slack.
	if grew := fds() - f0; grew > 8 {
		t.Fatalf("the daemon holds %d more fds after %d sessions of one live process ended with a reservation open (want one watch for the process)", grew, n)
	}
	r.d.quar.expireAll()
	waitUntil(t, "the quarantine to empty", func() bool { return r.d.quar.blocks.Load() == 0 })
	if grew := fds() - f0; grew > 2 {
		t.Fatalf("%d fds still held after the quarantine emptied", grew)
	}
}

// TestQuarantinedSessionsCountAgainstLimit: sessions that ended with
// reservations open, held in the quarantine with their slots, count
// against session.max_sessions; they did not, so one live process that
// opened a session, reserved and hung up, again and again, held host slots
// for as many sessions as it could open in the hold, past the limit.
func TestQuarantinedSessionsCountAgainstLimit(t *testing.T) {
	const limit = 3
	cfg := testConfig(t)
	cfg.Session.MaxSessions = limit
	r := startDaemon(t, cfg, slog.New(slog.DiscardHandler))
	t.Cleanup(r.d.quar.expireAll)
	ns := rawNS("quarantine-limit", 4096)
	for i := range limit {
		endWithReservation(t, r, ns, shm.Hash{Hi: 2, Lo: uint64(i)})
	}
	if q := r.d.quar.held.Load(); q != limit {
		t.Fatalf("%d sessions held in quarantine, want %d", q, limit)
	}
	if p, code := rawOpen(t, cfg.Socket, ns); p != nil || code != shm.CodeBusy {
		if p != nil {
			p.conn.Close()
			p.reg.Close()
		}
		t.Fatalf("session opened (code %d) with session.max_sessions (%d) sessions' reservations held in quarantine; want refused busy", code, limit)
	}
	r.d.quar.expireAll()
	waitUntil(t, "the quarantine to empty", func() bool { return r.d.quar.held.Load() == 0 })
	p, code := rawOpen(t, cfg.Socket, ns)
	if p == nil {
		t.Fatalf("session refused (%d) after the quarantine emptied", code)
	}
	p.conn.Close()
	p.reg.Close()
}

// endWithReservation opens a raw session in ns, reserves h and hangs up
// with the reservation open (the daemon quarantines it), then waits until
// the daemon has no session left.
func endWithReservation(t *testing.T, r *running, ns shm.Namespace, h shm.Hash) {
	t.Helper()
	p, code := rawOpen(t, r.d.cfg.Socket, ns)
	if p == nil {
		t.Fatalf("session for %v refused: %d (%d sessions held in quarantine)", h, code, r.d.quar.held.Load())
	}
	if c := p.do(shm.SQE{Op: shm.OpReserve, Hash: h}); c[0].Status != shm.StatusOK {
		t.Fatalf("reserve %v: %v", h, c[0].Status)
	}
	p.conn.Close()
	p.reg.Close()
	waitUntil(t, "the session to end", func() bool {
		r.d.mu.Lock()
		defer r.d.mu.Unlock()
		return len(r.d.sessions) == 0
	})
}
