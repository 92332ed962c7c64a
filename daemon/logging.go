package daemon

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// NewLogger builds the slog.Logger the config asks for, writing to w: text
// (logfmt) or JSON lines. Its level is a slog.LevelVar, so a Daemon given
// this logger applies a changed log.level on Reload; the format needs a
// restart.
func (l LogConfig) NewLogger(w io.Writer) *slog.Logger {
	lvl, err := parseLevel(l.Level)
	if err != nil {
		lvl = slog.LevelInfo
	}
	v := new(slog.LevelVar)
	v.Set(lvl)
	opts := &slog.HandlerOptions{Level: v}
	var h slog.Handler
	if l.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(leveled{Handler: h, level: v})
}

// leveled marks a handler built by NewLogger and carries the level it was
// built with. Loggers derived with With/WithGroup get the inner handler,
// which shares the same LevelVar.
type leveled struct {
	slog.Handler
	level *slog.LevelVar
}

// levelVarOf returns the reloadable level of a logger built by NewLogger,
// or nil for any other logger.
func levelVarOf(log *slog.Logger) *slog.LevelVar {
	if h, ok := log.Handler().(leveled); ok {
		return h.level
	}
	return nil
}

// Lines a peer causes (its handshake, its session's open, close and
// failures, its admin requests) are rate-limited per message: a local
// process can connect, or fail its ops, as fast as it likes, and journald
// drops every line of the service past its own limit (10,000 per 30 s by
// default), the ones that matter with them.
const (
	peerLogBurst = 32 // lines of one message logged at once
	peerLogRate  = 1  // and then per second
)

// logLimiter is a token bucket per message. Messages are constants of the
// call sites, so the map stays small.
type logLimiter struct {
	mu      sync.Mutex
	now     func() time.Time
	buckets map[string]*logBucket
}

type logBucket struct {
	tokens     float64
	last       time.Time
	suppressed uint64 // dropped since the last line logged
}

func newLogLimiter() *logLimiter {
	return &logLimiter{now: time.Now, buckets: map[string]*logBucket{}}
}

// allow reports whether a line of msg may be logged now, and how many of
// them were dropped since the last one that was.
func (l *logLimiter) allow(msg string) (bool, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := l.buckets[msg]
	if b == nil {
		b = &logBucket{tokens: peerLogBurst, last: now}
		l.buckets[msg] = b
	}
	b.tokens = min(peerLogBurst, b.tokens+now.Sub(b.last).Seconds()*peerLogRate)
	b.last = now
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	n := b.suppressed
	b.suppressed = 0
	return true, n
}

// limitedHandler drops what its limiter does not allow; a line logged
// after some were dropped carries their count as "suppressed".
type limitedHandler struct {
	slog.Handler
	lim *logLimiter
}

func (h limitedHandler) Handle(ctx context.Context, r slog.Record) error {
	ok, n := h.lim.allow(r.Message)
	if !ok {
		return nil
	}
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Uint64("suppressed", n))
	}
	return h.Handler.Handle(ctx, r)
}

func (h limitedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return limitedHandler{Handler: h.Handler.WithAttrs(as), lim: h.lim}
}

func (h limitedHandler) WithGroup(name string) slog.Handler {
	return limitedHandler{Handler: h.Handler.WithGroup(name), lim: h.lim}
}

// rateLimited returns log with lines rate-limited by lim, per message.
func rateLimited(log *slog.Logger, lim *logLimiter) *slog.Logger {
	return slog.New(limitedHandler{Handler: log.Handler(), lim: lim})
}
