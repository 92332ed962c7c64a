package tiers

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
	"github.com/kvtier/kvtier/tiers/policy"
)

// TestSetWatermarks: a reload lowers the watermarks of a running chain and
// the mover demotes down to the new low one; invalid pairs are refused.
func TestSetWatermarks(t *testing.T) {
	const slab, block = 1 << 20, 256 << 10
	h, err := NewHost(make([]byte, 8*slab), HostConfig{SlabBytes: slab})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := nvme.Open(context.Background(), nvme.Options{
		Dir: filepath.Join(t.TempDir(), "nvme"), CapacityBytes: nvme.MinCapacity, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := NewChain(h, store, ChainConfig{HighWatermark: 0.95, LowWatermark: 0.85, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	defer func() { cancel(); c.Wait() }()

	for _, bad := range [][2]float64{{0, 0}, {0.5, 0.5}, {0.5, 0.6}, {1.1, 0.5}, {0.5, 0}} {
		if err := c.SetWatermarks(bad[0], bad[1]); err == nil {
			t.Errorf("SetWatermarks(%v, %v) accepted", bad[0], bad[1])
		}
	}
	if hi, lo := c.Watermarks(); hi != 0.95 || lo != 0.85 {
		t.Fatalf("watermarks = %v/%v after refused changes, want the configured 0.95/0.85", hi, lo)
	}

	// 60% full: under the configured high watermark, nothing moves.
	const n = 8 * slab * 6 / 10 / block
	for i := range n {
		k := Key{NS: 1, Hash: shm.Hash{Hi: uint64(i) + 1, Lo: 42}}
		hd, err := c.Reserve(k, block)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Commit(hd); err != nil {
			t.Fatal(err)
		}
		c.Inserted(k, policy.AccessInfo{})
		c.Committed()
	}
	time.Sleep(300 * time.Millisecond) // three mover ticks
	if used, _ := h.Usage(); used != n*block {
		t.Fatalf("host tier used %d before the change, want %d (nothing demoted)", used, n*block)
	}

	if err := c.SetWatermarks(0.5, 0.3); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		used, capacity := h.Usage()
		if float64(used) <= 0.3*float64(capacity) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("host tier still at %d/%d bytes 5s after lowering the watermarks to 0.5/0.3", used, capacity)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := c.Stats(); st.Demoted == 0 {
		t.Errorf("no demotions counted: %+v", st)
	}
}

// TestWatermarkRatios: the effective watermarks are the configured ones
// times the capacity and pressure ratios, whichever changes last.
func TestWatermarkRatios(t *testing.T) {
	h, err := NewHost(make([]byte, 4<<20), HostConfig{SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewChain(h, nil, ChainConfig{HighWatermark: 0.9, LowWatermark: 0.8,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	check := func(what string, high, low float64) {
		t.Helper()
		if hi, lo := c.Watermarks(); !near(hi, high) || !near(lo, low) {
			t.Fatalf("%s: watermarks %v/%v, want %v/%v", what, hi, lo, high, low)
		}
	}
	if err := c.SetCapacityRatio(0.5); err != nil {
		t.Fatal(err)
	}
	check("capacity 0.5", 0.45, 0.4)
	if err := c.SetPressureRatio(0.5); err != nil {
		t.Fatal(err)
	}
	check("capacity 0.5, pressure 0.5", 0.225, 0.2)
	if err := c.SetWatermarks(0.8, 0.4); err != nil {
		t.Fatal(err)
	}
	check("reload under both", 0.2, 0.1)
	if hi, lo := c.ConfiguredWatermarks(); hi != 0.8 || lo != 0.4 {
		t.Fatalf("configured %v/%v", hi, lo)
	}
	for _, bad := range []float64{0, -1, 1.5} {
		if c.SetCapacityRatio(bad) == nil || c.SetPressureRatio(bad) == nil {
			t.Errorf("ratio %v accepted", bad)
		}
	}
	c.SetPressureRatio(1)
	c.SetCapacityRatio(1)
	check("ratios back to 1", 0.8, 0.4)
}
