package daemon

import (
	"context"
	"fmt"
	"time"

	sdnotify "github.com/coreos/go-systemd/v22/daemon"
	"github.com/dustin/go-humanize"
)

// statusInterval is how often the STATUS= line shown by `systemctl status`
// is refreshed.
var statusInterval = 10 * time.Second // a var for tests

// notify sends one sd_notify(3) message (newline-separated assignments) to
// $NOTIFY_SOCKET; without one (not under systemd) it does nothing.
func (d *Daemon) notify(state string) {
	if _, err := sdnotify.SdNotify(false, state); err != nil {
		d.log.Debug("sd_notify failed", "state", state, "err", err)
	}
}

// notifyStopping sends STOPPING=1 (with msg's other lines), once; later
// READY=1 or RELOADING=1 from a reload are not sent (notifyServing).
func (d *Daemon) notifyStopping() {
	d.notifyMu.Lock()
	defer d.notifyMu.Unlock()
	if d.stopping {
		return
	}
	d.stopping = true
	d.notify(sdnotify.SdNotifyStopping + "\nSTATUS=" + d.statusLine(true))
}

// notifyServing sends state (a reload's RELOADING=1 or READY=1) unless
// STOPPING=1 went out: a reload that ends during the drain would tell
// systemd the daemon is ready and serving again.
func (d *Daemon) notifyServing(state string) {
	d.notifyMu.Lock()
	defer d.notifyMu.Unlock()
	if !d.stopping {
		d.notify(state)
	}
}

// startNotify tells systemd the daemon is ready (the socket listens: New
// bound it) and starts the goroutine that owns the rest of the protocol:
// STATUS= every statusInterval, WATCHDOG=1 at half of WATCHDOG_USEC, and
// STOPPING=1 as soon as ctx (Run's) is cancelled. Watchdog pings go on while
// the daemon drains, so a long write-down of the host tier is not mistaken
// for a hang; the returned stop ends the goroutine, waits for it, and sends
// STOPPING=1 if Run ended for another reason than ctx.
func (d *Daemon) startNotify(ctx context.Context) (stop func()) {
	wd, err := sdnotify.SdWatchdogEnabled(false)
	if err != nil {
		d.log.Warn("systemd watchdog settings unreadable; not pinging", "err", err)
		wd = 0
	}
	d.notify(sdnotify.SdNotifyReady + "\nSTATUS=" + d.statusLine(false))
	if wd > 0 {
		d.log.Info("systemd watchdog enabled", "timeout", wd, "ping_every", wd/2)
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	sentStopping := false
	go func() {
		defer close(exited)
		var ping <-chan time.Time
		if wd > 0 {
			t := time.NewTicker(wd / 2)
			defer t.Stop()
			ping = t.C
		}
		status := time.NewTicker(statusInterval)
		defer status.Stop()
		stopping := ctx.Done()
		for {
			select {
			case <-done:
				return
			case <-stopping:
				stopping = nil
				sentStopping = true
				d.notifyStopping()
			case <-ping:
				// Counting sessions takes the session table's lock: a daemon
				// wedged on it stops pinging and systemd restarts it.
				d.sessionCount()
				d.notify(sdnotify.SdNotifyWatchdog)
			case <-status.C:
				d.notify("STATUS=" + d.statusLine(sentStopping))
			}
		}
	}()
	return func() {
		close(done)
		<-exited
		d.notifyStopping() // if Run ended for another reason than ctx
	}
}

func (d *Daemon) sessionCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.sessions)
}

// statusLine is the one-line state systemd shows: the socket, sessions and
// tier occupancy while serving; what is left to drain while stopping (the
// tiers may be closing then, and are not touched).
func (d *Daemon) statusLine(stopping bool) string {
	n := d.sessionCount()
	if d.closing.Load() || stopping {
		return fmt.Sprintf("stopping: %d sessions left to close", n)
	}
	hs := d.host.Stats()
	s := fmt.Sprintf("serving %s; %d sessions; host %s/%s (%d blocks)", d.cfg.Socket, n,
		humanize.IBytes(uint64(hs.UsedBytes)), humanize.IBytes(uint64(d.hostCapacity(hs.CapacityBytes))), hs.Blocks)
	if d.chain.NVMe != nil {
		ns := d.chain.NVMe.Stats()
		s += fmt.Sprintf("; nvme %s/%s (%d blocks)", humanize.IBytes(uint64(ns.Bytes)), humanize.IBytes(uint64(ns.Capacity)), ns.Blocks)
	} else {
		s += "; nvme off"
	}
	return s
}
