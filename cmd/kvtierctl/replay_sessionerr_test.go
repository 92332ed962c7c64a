package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/tiers/trace"
)

// When one session's request fails, replay must stop the other sessions and
// return that error. It waited for every other session to finish its share
// of the trace (here a request due 10 minutes in; hours on a real trace at
// --speed 1), then printed only the error.
func TestReplaySessionErrorStopsOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon")
	}
	sock, _ := restartableDaemon(t, t.TempDir(), 32)
	// Requests are dealt round-robin: 0 to session 0, 1 to session 1.
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 512, HashIDs: []int64{1}},
		{Timestamp: 600000, InputLength: 512, HashIDs: []int64{2}},
	}
	path := writeTrace(t, reqs)
	boom := errors.New("boom")
	replayRequestHook = func(ri int, err error) error {
		if ri == 0 {
			return boom // request 0 fails
		}
		return err
	}
	defer func() { replayRequestHook = nil }()
	// A watchdog, not a timing assertion: only a replay that waits for the
	// 10-minute request runs into it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, _, err := runCtx(ctx, "replay", "--socket", sock, "--block-size", "16KiB", "--fresh", "--sessions", "2", "--speed", "1", path)
	if !errors.Is(err, boom) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		!strings.Contains(err.Error(), "request 0 (line 1)") {
		t.Fatalf("replay: %v; want request 0's error alone, without waiting for session 1", err)
	}
}
