package daemon

import (
	"context"
	"errors"
	"os"
	"testing"
)

// TestWarmFailedStartClosesIndex: a start that fails after the stored
// arena was opened and before its blocks were adopted (a stop asked for
// during start-up, an NVMe reindex cut short, a tier that cannot be set
// up) must close the index snapshot systemd passed, as it closes the
// arena. It used to keep the index's fd open: closeResources knew nothing
// of it, and adoptWarm, which closes it, never ran.
func TestWarmFailedStartClosesIndex(t *testing.T) {
	store := newFakeFdStore(t)
	cfg := testConfig(t)
	r1 := startDaemon(t, cfg, nil)
	putWarm(t, cfg.Socket, 4, 64*KiB)
	r1.stop(t)
	store.sync()

	files := store.pass()
	var index *os.File
	for _, f := range files {
		if f.Name() == fdNameIndex {
			index = f
		}
	}
	if index == nil {
		t.Fatal("no index snapshot stored at the clean stop")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	old := storedFiles
	storedFiles = func() []*os.File {
		storedFiles = old
		cancel() // a stop asked for while the arena is being opened
		return files
	}
	t.Cleanup(func() { storedFiles = old })
	d, err := NewContext(ctx, cfg, nil)
	if err == nil {
		d.closeResources()
		t.Fatal("start-up stopped by its context succeeded")
	}
	if _, err := index.Stat(); !errors.Is(err, os.ErrClosed) {
		index.Close()
		t.Fatalf("index snapshot still open after the failed start (stat: %v): its fd leaked", err)
	}
}
