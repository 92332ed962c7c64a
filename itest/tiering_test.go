package itest

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
)

// withNVMe turns the NVMe tier on with a small budget.
func withNVMe(c *daemon.Config) {
	c.NVMe.Enabled = true
	c.NVMe.Capacity = 256 << 20
	c.NVMe.FlushOnStop = true
}

func hostUsed(st *client.Stats) (used, capacity int64) {
	for _, t := range st.Tiers {
		if t.Name == "host" {
			return t.UsedBytes, t.CapacityBytes
		}
	}
	return 0, 0
}

// TestTieringDemotePromoteRestart fills a small host tier well past its
// capacity: the mover demotes the coldest blocks to NVMe, a Get of a
// demoted block promotes it byte-exact, and after a restart on the same
// state dir every block is still served (written down at stop, re-indexed at
// start).
func TestTieringDemotePromoteRestart(t *testing.T) {
	const bs = 1 << 20
	ip := startInProc(t, "32MiB", 4<<20, withNVMe)
	ctx := context.Background()
	c := dial(t, ip.cfg.Socket)
	s := open(t, c, testNS("tiering", bs))
	hs := chain(7, 96) // 96 MiB: three times the host tier
	for i, h := range hs {
		if _, err := s.Put(ctx, h, payload(h, bs)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		// Give the mover the time a real workload's think time gives it:
		// blocks written faster than NVMe absorbs them are dropped by the
		// host tier's own eviction instead (tested in TestEvictionLRU).
		waitStats(t, c, 5*time.Second, func(st *client.Stats) bool {
			used, capacity := hostUsed(st)
			return float64(used) <= 0.95*float64(capacity)
		})
	}
	st := stats(t, c)
	var moved uint64
	for _, m := range st.Moves {
		if m.From == "host" && m.To == "nvme" {
			moved = m.Blocks
		}
	}
	if moved < 60 {
		t.Fatalf("demoted %d blocks host→nvme, want ≥ 60 (stats %+v)", moved, st.Moves)
	}
	res, err := s.Lookup(ctx, hs)
	if err != nil || res.Hits != len(hs) {
		t.Fatalf("lookup: %d of %d hits, err %v", res.Hits, len(hs), err)
	}
	if res.Tiers[0] != client.TierNVMe || res.Tiers[len(hs)-1] != client.TierHost {
		t.Fatalf("tiers: first %v last %v, want nvme and host", res.Tiers[0], res.Tiers[len(hs)-1])
	}
	dst := make([]byte, bs)
	for i, h := range hs {
		if err := s.Get(ctx, h, dst); err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		if !bytes.Equal(dst, payload(h, bs)) {
			t.Fatalf("get %d: wrong bytes", i)
		}
	}
	st = stats(t, c)
	var promoted uint64
	for _, m := range st.Moves {
		if m.From == "nvme" && m.To == "host" {
			promoted = m.Blocks
		}
	}
	if promoted == 0 {
		t.Fatalf("no promotion counted: %+v", st.Moves)
	}
	s.Close()
	c.Close()

	// Restart: stop writes the host tier down; the new daemon re-indexes.
	if err := ip.stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	d2, err := daemon.New(ip.cfg, slog.New(slog.NewTextHandler(ip.log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d2.Run(ctx2) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("second daemon: %v", err)
		}
	}()
	c2 := dial(t, ip.cfg.Socket)
	defer c2.Close()
	s2 := open(t, c2, testNS("tiering", bs))
	defer s2.Close()
	res, err = s2.Lookup(ctx, hs)
	if err != nil || res.Hits != len(hs) {
		t.Fatalf("after restart: %d of %d hits, err %v", res.Hits, len(hs), err)
	}
	for i, h := range hs {
		if err := s2.Get(ctx, h, dst); err != nil {
			t.Fatalf("after restart: get %d: %v", i, err)
		}
		if !bytes.Equal(dst, payload(h, bs)) {
			t.Fatalf("after restart: get %d: wrong bytes", i)
		}
	}
}

// TestTieringDeleteReachesNVMe: a deleted block is gone from every tier, and
// a duplicate put of a block that lives only in NVMe is a no-op.
func TestTieringDeleteReachesNVMe(t *testing.T) {
	const bs = 1 << 20
	ip := startInProc(t, "32MiB", 4<<20, withNVMe)
	ctx := context.Background()
	c := dial(t, ip.cfg.Socket)
	defer c.Close()
	s := open(t, c, testNS("tiering-del", bs))
	defer s.Close()
	hs := chain(9, 64)
	for _, h := range hs {
		if _, err := s.Put(ctx, h, payload(h, bs)); err != nil {
			t.Fatal(err)
		}
		waitStats(t, c, 5*time.Second, func(st *client.Stats) bool {
			used, capacity := hostUsed(st)
			return float64(used) <= 0.95*float64(capacity)
		})
	}
	res, err := s.Lookup(ctx, hs[:1])
	if err != nil || res.Hits != 1 || res.Tiers[0] != client.TierNVMe {
		t.Fatalf("oldest block should be in nvme: %+v %v", res, err)
	}
	if stored, err := s.Put(ctx, hs[0], payload(hs[0], bs)); err != nil || stored {
		t.Fatalf("duplicate put of an nvme block: stored=%v err=%v", stored, err)
	}
	if ok, err := s.Delete(ctx, hs[0]); err != nil || !ok {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if err := s.Get(ctx, hs[0], make([]byte, bs)); err != client.ErrNotFound {
		t.Fatalf("get after delete: %v, want ErrNotFound", err)
	}
}

func parkedBlocks(t testing.TB, c *client.Client) int { return stats(t, c).ParkedBlocks }

// TestParkResume parks a paused request, floods the cache with three times
// the host tier and more than the NVMe budget of ordinary blocks, and
// resumes the request byte-exact: parked blocks are swapped out to NVMe
// and never dropped for space.
func TestParkResume(t *testing.T) {
	const bs = 1 << 20
	ip := startInProc(t, "32MiB", 4<<20, func(c *daemon.Config) {
		withNVMe(c)
		c.NVMe.Capacity = 64 << 20 // the minimum: ordinary blocks must be evicted
		// 12 MiB parked is past half of this tier's 16 MiB budget.
		c.NVMe.ParkedShare = 1
	})
	ctx := context.Background()
	c := dial(t, ip.cfg.Socket)
	defer c.Close()
	s := open(t, c, testNS("park", bs))
	defer s.Close()

	const req, n = 4242, 12
	blocks := make([][]byte, n)
	for i := range blocks {
		blocks[i] = payload(client.Hash{Hi: req, Lo: uint64(i) + 1000}, bs)
	}
	if err := s.Park(ctx, req, blocks); err != nil {
		t.Fatal(err)
	}
	if err := s.Park(ctx, req, blocks); !errors.Is(err, client.ErrParked) {
		t.Fatalf("second park: %v, want ErrParked", err)
	}
	// Swap-out: the parked blocks leave host memory once written through.
	if _, _, ok := waitStats(t, c, 5*time.Second, func(st *client.Stats) bool {
		used, _ := hostUsed(st)
		return st.ParkedBlocks == n && used == 0
	}); !ok {
		t.Fatalf("parked blocks not swapped out: %+v", stats(t, c).Tiers)
	}
	// Parked blocks are not visible as prefix blocks.
	if res, err := s.Lookup(ctx, []client.Hash{{Hi: req, Lo: 0}}); err != nil || res.Hits != 0 {
		t.Fatalf("lookup of a parked key: %+v %v", res, err)
	}
	hs := chain(11, 160) // 160 MiB of ordinary blocks through a 32 MiB host and 64 MiB disk
	for _, h := range hs {
		if _, err := s.Put(ctx, h, payload(h, bs)); err != nil {
			t.Fatal(err)
		}
		waitStats(t, c, 5*time.Second, func(st *client.Stats) bool {
			used, capacity := hostUsed(st)
			return float64(used) <= 0.95*float64(capacity)
		})
	}
	var nvmeEvictions uint64
	for _, tr := range stats(t, c).Tiers {
		if tr.Name == "nvme" {
			nvmeEvictions = tr.Evictions
		}
	}
	if nvmeEvictions == 0 {
		t.Fatalf("the flood did not pressure the NVMe budget")
	}
	dsts := make([][]byte, n)
	for i := range dsts {
		dsts[i] = make([]byte, bs)
	}
	if err := s.Resume(ctx, req, dsts); err != nil {
		t.Fatalf("resume after %d nvme evictions: %v", nvmeEvictions, err)
	}
	for i := range dsts {
		if !bytes.Equal(dsts[i], blocks[i]) {
			t.Fatalf("resumed block %d differs", i)
		}
	}
	if got := parkedBlocks(t, c); got != 0 {
		t.Fatalf("%d parked blocks left after resume", got)
	}
	if err := s.Resume(ctx, req, dsts); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("second resume: %v, want ErrNotFound", err)
	}
}

// TestEvictDropsParked: an operator's evict of a namespace drops its
// parked requests too (from NVMe, where they are otherwise never evicted),
// and leaves other namespaces' parked requests alone.
func TestEvictDropsParked(t *testing.T) {
	const bs = 64 << 10
	ip := startInProc(t, "32MiB", 4<<20, withNVMe)
	ctx := context.Background()
	c := dial(t, ip.cfg.Socket)
	defer c.Close()
	s := open(t, c, testNS("park-evict", bs))
	defer s.Close()
	other := open(t, c, testNS("park-keep", bs))
	defer other.Close()
	blocks := make([][]byte, 5)
	for i := range blocks {
		blocks[i] = payload(client.Hash{Hi: 77, Lo: uint64(i)}, bs)
	}
	if err := s.Park(ctx, 1, blocks); err != nil {
		t.Fatal(err)
	}
	if err := other.Park(ctx, 1, blocks[:2]); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := waitStats(t, c, 5*time.Second, func(st *client.Stats) bool {
		used, _ := hostUsed(st)
		return st.ParkedBlocks == 7 && used == 0 // written through to NVMe
	}); !ok {
		t.Fatalf("parked blocks not swapped out: %+v", stats(t, c))
	}
	n, err := c.Evict(ctx, s.NamespaceID(), false)
	if err != nil || n != len(blocks) {
		t.Fatalf("evict: %d blocks, %v; want %d", n, err, len(blocks))
	}
	if got := parkedBlocks(t, c); got != 2 {
		t.Fatalf("%d parked blocks after the evict, want the other namespace's 2", got)
	}
	dsts := [][]byte{make([]byte, bs)}
	if err := s.Resume(ctx, 1, dsts); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("resume after evict: %v, want ErrNotFound", err)
	}
	dsts = [][]byte{make([]byte, bs), make([]byte, bs)}
	if err := other.Resume(ctx, 1, dsts); err != nil || !bytes.Equal(dsts[1], blocks[1]) {
		t.Fatalf("the other namespace's parked request: %v", err)
	}
}

// TestParkTTL: a parked request nobody resumes expires.
func TestParkTTL(t *testing.T) {
	const bs = 64 << 10
	ip := startInProc(t, "32MiB", 4<<20, func(c *daemon.Config) {
		withNVMe(c)
		c.NVMe.ParkTTLSeconds = 1
	})
	ctx := context.Background()
	c := dial(t, ip.cfg.Socket)
	defer c.Close()
	s := open(t, c, testNS("park-ttl", bs))
	defer s.Close()
	blocks := [][]byte{make([]byte, bs), make([]byte, bs)}
	if err := s.Park(ctx, 7, blocks); err != nil {
		t.Fatal(err)
	}
	if _, waited, ok := waitStats(t, c, 5*time.Second, func(st *client.Stats) bool { return st.ParkedBlocks == 0 }); !ok {
		t.Fatal("parked blocks did not expire")
	} else {
		t.Logf("expired after %v", waited)
	}
	if err := s.Resume(ctx, 7, blocks); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("resume after TTL: %v, want ErrNotFound", err)
	}
	if n, err := s.Unpark(ctx, 8, -1); err == nil || n != 0 {
		t.Fatalf("unpark of -1 blocks: %d %v, want an error", n, err)
	}
	if n, err := s.Unpark(ctx, 8, 2); err != nil || n != 0 {
		t.Fatalf("unpark of an unknown request: %d %v", n, err)
	}
}
