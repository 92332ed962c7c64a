package daemon

import (
	"io"
	"log/slog"
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
