package daemon

import (
	"context"
	"testing"

	"github.com/kvtier/kvtier/client"
)

// TestWarmRestartAfterCrashFreshArena: after a crash systemd passes the
// arena back without an index. Its clients of the crashed daemon still map
// it, and a copy one of them had queued into its reservation (a device
// client's device-to-host DMA behind an inference step) may land after the
// next daemon has started: nothing quarantined that reservation. A daemon
// that reuses such an arena hands the slot to another session, whose
// committed block the late copy then overwrites. With no index nothing is
// adopted, so the next daemon must start on a fresh arena.
func TestWarmRestartAfterCrashFreshArena(t *testing.T) {
	store := newFakeFdStore(t)
	cfg := testConfig(t)
	const n, bs = 16, 64 * KiB
	ctx := context.Background()

	r1 := startDaemon(t, cfg, nil)
	c, err := client.Dial(ctx, client.Options{Socket: cfg.Socket, Name: "crashed-daemon-client"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, testNamespace(bs))
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Reserve(ctx, testHash(1000))
	if err != nil {
		t.Fatal(err)
	}
	late := res.Bytes() // the client's mapping of the arena, at its reserved slot

	// A crash: the arena stays in the store, no index snapshot is stored.
	r1.stop(t)
	store.sync()
	store.mu.Lock()
	kept := store.fds[:0]
	for _, sf := range store.fds {
		if sf.name == fdNameIndex {
			sf.f.Close()
			continue
		}
		kept = append(kept, sf)
	}
	store.fds = kept
	store.mu.Unlock()

	withStoredFiles(t, store.pass())
	r2 := startDaemon(t, cfg, nil)
	if r2.d.warm.adopted != 0 {
		t.Fatalf("adopted %d blocks without an index", r2.d.warm.adopted)
	}
	putWarm(t, cfg.Socket, n, bs)
	// The crashed daemon's client's queued copy lands now.
	for i := range late {
		late[i] = 0xEE
	}
	got := getWarm(t, cfg.Socket, n, bs) // fails on wrong bytes
	if count(got) != n {
		t.Fatalf("served %d of %d blocks put after the restart", count(got), n)
	}
	_ = res.Abort(ctx)
	r2.stop(t)
}
