package nvme

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// badgerLogger forwards badger's printf-style logs to slog. Badger is
// chatty at INFO (every compaction), so its Info goes to Debug.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) log(level slog.Level, f string, args ...any) {
	if !b.l.Enabled(context.Background(), level) {
		return
	}
	b.l.Log(context.Background(), level, strings.TrimRight(fmt.Sprintf(f, args...), "\n"), "component", "badger")
}

func (b badgerLogger) Errorf(f string, a ...any)   { b.log(slog.LevelError, f, a...) }
func (b badgerLogger) Warningf(f string, a ...any) { b.log(slog.LevelWarn, f, a...) }
func (b badgerLogger) Infof(f string, a ...any)    { b.log(slog.LevelDebug, f, a...) }
func (b badgerLogger) Debugf(f string, a ...any)   { b.log(slog.LevelDebug-4, f, a...) }
