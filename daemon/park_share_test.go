package daemon

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
)

// TestParkRefusedPastParkedShare: an engine that parks request after
// request (never resuming) filled NVMe with unevictable blocks, evicting
// every other model's cache there. Past nvme.parked_share of the tier a
// Park fails with ErrFull, counted, and the rest of the tier still takes
// ordinary blocks.
func TestParkRefusedPastParkedShare(t *testing.T) {
	cfg := testConfig(t)
	cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.ParkedShare = true, 64*MiB, 0.25
	r := startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	c := dialDaemon(t, cfg)
	s, err := c.Open(ctx, testNamespace(256*KiB))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	limit := int64(cfg.NVMe.ParkedShare * float64(r.d.nvme.LogicalBudget()))
	req := [][]byte{bytes.Repeat([]byte{1}, s.BlockBytes()), bytes.Repeat([]byte{2}, s.BlockBytes())}
	parked := 0
	for id := uint64(1); ; id++ {
		err := s.Park(ctx, id, req)
		if errors.Is(err, client.ErrFull) {
			break
		}
		if err != nil {
			t.Fatalf("park request %d: %v", id, err)
		}
		parked++
		want := int64(parked * len(req) * s.BlockBytes())
		for deadline := time.Now().Add(10 * time.Second); r.d.chain.Stats().ParkedNVMeBytes < want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("parked request %d not written through in 10s", id)
			}
		}
		if want > 4*limit {
			t.Fatalf("%d requests parked (%d bytes on NVMe) with nvme.parked_share 0.25 of %d bytes: never refused", parked, want, r.d.nvme.LogicalBudget())
		}
	}
	st := r.d.chain.Stats()
	t.Logf("%d requests parked, %d bytes of parked blocks on NVMe, share %d", parked, st.ParkedNVMeBytes, limit)
	if st.ParkedNVMeBytes > limit {
		t.Fatalf("%d bytes of parked blocks on NVMe, past nvme.parked_share (%d)", st.ParkedNVMeBytes, limit)
	}
	if st.ParkRefused == 0 {
		t.Fatal("park refused but not counted (kvtier_park_refused_total)")
	}
	// The refused park left nothing parked, and ordinary blocks still go in.
	dsts := [][]byte{make([]byte, s.BlockBytes()), make([]byte, s.BlockBytes())}
	if err := s.Resume(ctx, uint64(parked+1), dsts); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("resume of the refused request: %v, want ErrNotFound", err)
	}
	putBlocks(t, s, 8)
}
