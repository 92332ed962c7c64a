package daemon

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// holdingHandler logs to the test and holds the first record whose message
// is msg until open is closed; entered is closed when it is reached.
type holdingHandler struct {
	slog.Handler
	msg     string
	once    *sync.Once
	entered chan struct{}
	open    chan struct{}
}

func (h holdingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() {
			close(h.entered)
			<-h.open
		})
	}
	return h.Handler.Handle(ctx, r)
}

func (h holdingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h holdingHandler) WithGroup(g string) slog.Handler {
	h.Handler = h.Handler.WithGroup(g)
	return h
}

// TestReloadDuringStopSendsNoReady: a reload (SIGHUP) still running when
// the stop begins ends without telling systemd READY=1 after STOPPING=1.
// It did: systemd's notify state for the unit went back from stopping to
// ready during the drain, and when the reload's STATUS was computed before
// the stop was seen, `systemctl status` said "serving ..." until the next
// STATUS (10 s).
func TestReloadDuringStopSendsNoReady(t *testing.T) {
	sock := newFakeNotifySocket(t)
	cfg := testConfig(t)
	h := holdingHandler{
		Handler: slog.NewTextHandler(testWriter{t}, nil), msg: "configuration reloaded",
		once: &sync.Once{}, entered: make(chan struct{}), open: make(chan struct{}),
	}
	r := startDaemon(t, cfg, slog.New(h))
	sock.await("READY=1", 5*time.Second)

	next := cfg
	next.Host.HighWatermark, next.Host.LowWatermark = 0.9, 0.8
	reloaded := make(chan error, 1)
	go func() { reloaded <- r.d.Reload(next) }()
	<-h.entered // the reload is applied, its READY=1 not sent yet
	sock.await("RELOADING=1", 5*time.Second)
	r.cancel() // SIGTERM
	sock.await("STOPPING=1", 5*time.Second)
	close(h.open)
	if err := <-reloaded; err != nil {
		t.Fatalf("Reload: %v", err)
	}
	r.stop(t)

	// Run has returned: whatever it sent is queued, and read at once.
	buf := make([]byte, 4096)
	sock.conn.SetReadDeadline(time.Now().Add(time.Second))
	for {
		n, err := sock.conn.Read(buf)
		if err != nil {
			break
		}
		msg := string(buf[:n])
		if hasAssignment(msg, "READY=1") || hasAssignment(msg, "STATUS=serving") {
			t.Errorf("after STOPPING=1, kvtierd sent %q", msg)
		}
		if strings.Contains(msg, "RELOADING=1") {
			t.Errorf("after STOPPING=1, kvtierd sent %q", msg)
		}
	}
}
