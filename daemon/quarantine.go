package daemon

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/tiers"
)

// A device client writes a reserved slot with a copy queued on one of its
// CUDA streams (device-to-device into the GPU arena, device-to-host DMA into
// the pinned host arena) and commits only after the copy's event. When its
// session ends with reservations still open, those copies may not have run
// yet, and nothing the daemon does can cancel them: they run until the
// client's CUDA context is destroyed, which for a dying process happens when
// the kernel closes its driver files. The exit tracer and the socket's EOF
// both come before that. Aborting such a reservation at once would let the
// slot be handed to another session, and the late copy would then overwrite
// that session's committed block: wrong bytes served to a third party. So
// the reservations of a device session are held (quarantined) until its
// process has exited, seen on a pidfd, which the kernel signals only after
// the process's files are closed; or, for a process still alive (a session
// closed by the daemon, or a client closing with copies queued against the
// client library's contract), until quarantineHold has passed, long enough
// for any copy queued behind an inference step to run.
//
// A CPU client writes a reserved host slot itself, with a memcpy through
// its own mapping of the arena. The client library keeps that mapping for
// as long as a reservation is open, after the session's connection is gone
// (closed by the daemon: a shutdown, an exit event, a protocol breach; or
// dropped by the client while one of its goroutines still copies), so the
// same holds for it: its reservations are quarantined too. Its process
// exiting unmaps the arena, and so ends the hazard just the same.
const quarantineHold = 10 * time.Second

// quarantinePoll bounds how late a new entry or a stop is noticed while
// the quarantine waits on pidfds; an exit is noticed at once.
const quarantinePoll = 20 * time.Millisecond

// quarantine holds reservations until their process has exited or their
// deadline has passed, then aborts them. One goroutine (run) releases
// them; sessions add entries from their teardown.
type quarantine struct {
	log  *slog.Logger
	hold atomic.Int64 // a time.Duration: quarantineHold; tests shorten it

	mu      sync.Mutex
	entries []quarantined
	// watches holds one pidfd per process whose entries are held, shared
	// by its entries: a client that ends session after session would
	// otherwise make the daemon hold an fd per session for the hold.
	watches map[uint32]*pidWatch
	closing bool          // no more entries: run ends once they are released
	drop    bool          // release every entry now (close without wait)
	wake    chan struct{} // an entry was added or closing set (capacity 1)
	done    chan struct{} // closed when run has released everything and returned

	blocks atomic.Int64 // reservations held now
	// held counts the entries (sessions ended with reservations open) held
	// now: they count against session.max_sessions, or a live process
	// that opened, reserved and hung up again and again held host slots
	// past any limit on sessions.
	held  atomic.Int64
	total atomic.Uint64
}

type quarantined struct {
	pid     uint32
	w       *pidWatch
	until   time.Time
	since   time.Time
	handles []*tiers.Handle
}

// processExited reports whether process pid has exited: reaped, or a
// zombie (its files are closed). A pid already reused by another process,
// or one that cannot be watched, reads as alive.
func processExited(pid uint32) bool {
	w, exited := watchProc(pid)
	w.close()
	return exited
}

// pidWatch is a procWatch shared by the entries of one process (q.mu).
type pidWatch struct {
	w    procWatch
	refs int
}

// watch returns a watch on pid, shared with the entries already held for
// it, or exited when pid has exited. A shared watch that reports an exit
// is not reused: pid may name a new process now. q.mu held.
func (q *quarantine) watch(pid uint32) (pw *pidWatch, exited bool) {
	if pw = q.watches[pid]; pw != nil && !pollExited([]procWatch{pw.w}, 0)[0] {
		pw.refs++
		return pw, false
	}
	w, exited := watchProc(pid)
	if exited {
		return nil, true
	}
	pw = &pidWatch{w: w, refs: 1}
	q.watches[pid] = pw // one that exited stays with its entries until they go
	return pw, false
}

// unwatch drops an entry's reference to its watch. q.mu held.
func (q *quarantine) unwatch(pid uint32, pw *pidWatch) {
	if pw.refs--; pw.refs > 0 {
		return
	}
	pw.w.close()
	if q.watches[pid] == pw {
		delete(q.watches, pid)
	}
}

func newQuarantine(log *slog.Logger) *quarantine {
	q := &quarantine{log: log, wake: make(chan struct{}, 1), done: make(chan struct{}), watches: map[uint32]*pidWatch{}}
	q.hold.Store(int64(quarantineHold))
	return q
}

// add takes the reservations of a session of process pid that ended with
// them open. They are aborted here when pid has exited
// already, else when it exits or the hold passes. After close (the daemon
// is past its sessions) they wait for the same conditions in close itself.
func (q *quarantine) add(pid uint32, handles []*tiers.Handle) {
	if len(handles) == 0 {
		return
	}
	q.mu.Lock()
	w, exited := q.watch(pid)
	q.mu.Unlock()
	if exited {
		abortAll(handles)
		return
	}
	// The slots are held, not their keys: another session's put of the
	// same block gets a slot of its own (a key left reserved would answer
	// it "exists" for as long as the hold lasts).
	for _, h := range handles {
		h.Owner().Disown(h)
	}
	now, hold := time.Now(), time.Duration(q.hold.Load())
	q.mu.Lock()
	q.entries = append(q.entries, quarantined{pid: pid, w: w, until: now.Add(hold), since: now, handles: handles})
	q.held.Add(1)
	q.mu.Unlock()
	q.blocks.Add(int64(len(handles)))
	q.total.Add(uint64(len(handles)))
	q.log.Info("session ended with reservations open, which its client may still write; holding them until its process exits",
		"pid", pid, "reservations", len(handles), "at_most", hold)
	q.signal()
}

func (q *quarantine) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func abortAll(hs []*tiers.Handle) {
	for _, h := range hs {
		h.Owner().Abort(h)
	}
}

// run releases entries as their processes exit or their holds pass, until
// close has been called and nothing is left. ctx ending releases
// everything at once (the daemon is being torn down without Run's orderly
// shutdown).
func (q *quarantine) run(ctx context.Context) {
	defer close(q.done)
	for {
		q.mu.Lock()
		n, closing, drop := len(q.entries), q.closing, q.drop
		ws := make([]procWatch, n)
		for i, e := range q.entries {
			ws[i] = e.w.w
		}
		q.mu.Unlock()
		if ctx.Err() != nil {
			q.release(func(quarantined, int) bool { return true }, "daemon stopping")
			return
		}
		if drop && n > 0 {
			q.release(func(quarantined, int) bool { return true }, "daemon stopping; the host arena is not kept")
			continue
		}
		if n == 0 {
			if closing {
				return
			}
			select {
			case <-q.wake:
			case <-ctx.Done():
			}
			continue
		}
		exited := pollExited(ws, quarantinePoll)
		now := time.Now()
		q.release(func(e quarantined, i int) bool {
			return (i < len(exited) && exited[i]) || !now.Before(e.until)
		}, "")
	}
}

// release aborts the entries for which free holds; i is the entry's index
// at the last snapshot, valid because only run removes entries.
func (q *quarantine) release(free func(e quarantined, i int) bool, why string) {
	q.mu.Lock()
	var out []quarantined
	kept := q.entries[:0]
	for i, e := range q.entries {
		if free(e, i) {
			out = append(out, e)
			q.unwatch(e.pid, e.w)
			q.held.Add(-1)
		} else {
			kept = append(kept, e)
		}
	}
	clear(q.entries[len(kept):])
	q.entries = kept
	q.mu.Unlock()
	now := time.Now()
	for _, e := range out {
		abortAll(e.handles)
		q.blocks.Add(-int64(len(e.handles)))
		reason := why
		switch {
		case reason != "":
		case now.Before(e.until):
			reason = "process exited"
		default:
			reason = "hold expired with the process alive"
		}
		q.log.Info("quarantined reservations released", "pid", e.pid, "reservations", len(e.handles),
			"held", now.Sub(e.since).Round(time.Millisecond), "reason", reason)
	}
}

// close waits until every entry is released (their processes exit or their
// holds pass: at most hold) and run has returned. Without wait, the entries
// are released at once: nothing will hand their slots out any more (the
// daemon is stopping and its host arena is not kept for a next one).
// Sessions must be done: add after close is not allowed.
func (q *quarantine) close(wait bool) {
	q.mu.Lock()
	q.closing = true
	q.drop = !wait
	q.mu.Unlock()
	q.signal()
	<-q.done
}
