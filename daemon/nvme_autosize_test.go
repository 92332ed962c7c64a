package daemon

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// TestNVMeAutoCapacityStableAcrossRestart: with nvme.capacity = 0 the
// budget is sized from the disk at start. The tier's own files must count
// as room it has, not as space taken: otherwise every restart of a filled
// cache starts with a smaller budget and evicts blocks it had kept.
func TestNVMeAutoCapacityStableAcrossRestart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs as the state dir needs root")
	}
	cfg := testConfig(t)
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", cfg.StateDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=256m,mode=0750"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(cfg.StateDir, unix.MNT_DETACH) })
	cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 0
	log := slog.New(slog.DiscardHandler)
	const epoch = 0x5eed

	s, err := openNVMe(context.Background(), cfg, epoch, false, log)
	if err != nil {
		t.Fatal(err)
	}
	first := s.Stats().Capacity
	block := make([]byte, 1<<20)
	const blocks = 56 // well under the first budget's logical limit
	for i := range blocks {
		block[0] = byte(i)
		if err := s.Put(nvme.Key{NS: 1, Hash: shm.Hash{Lo: uint64(i + 1)}}, block); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = openNVMe(context.Background(), cfg, epoch, false, log)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := s.Stats()
	t.Logf("capacity %d MiB at first start, %d MiB after a restart with %d blocks (disk %d MiB)",
		first>>20, st.Capacity>>20, st.Blocks, st.DiskBytes>>20)
	if st.Blocks != blocks {
		t.Fatalf("%d blocks after the restart, want %d", st.Blocks, blocks)
	}
	// The small files beside the tier (registry, epoch, locks) may move it
	// by a few pages, not by the tier's own size.
	if d := first - st.Capacity; d > 1<<20 || d < -(1<<20) {
		t.Errorf("capacity %d after a restart, %d at the first start: the budget shrank by the cache's own files", st.Capacity, first)
	}
	if lim := st.LogicalLimit; st.Bytes > lim {
		t.Errorf("restarted over its own logical limit: %d bytes > %d: the next Put evicts warm blocks", st.Bytes, lim)
	}
}
