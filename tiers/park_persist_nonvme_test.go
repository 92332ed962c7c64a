package tiers

import (
	"context"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
)

// TestParkTTLSurvivesRunWithoutNVMe: a daemon that runs one start without
// its NVMe tier (nvme.enabled off for a while, or the tier failing to open:
// the daemon then serves from the host tier alone) never sees the parked
// blocks NVMe keeps, so it must keep their stored expiries for the start
// after it, as a chain stopped without Start does. Start used to take them
// over and drop them, so the next start with the tier back gave every
// parked block in NVMe a fresh TTL.
func TestParkTTLSurvivesRunWithoutNVMe(t *testing.T) {
	const bs = 64 << 10
	const left = 2 * time.Minute
	k := Key{NS: 5 | ParkedNS, Hash: shm.Hash{Hi: 79, Lo: 1}}
	dir := t.TempDir()
	cfg := ChainConfig{ParkTTL: time.Hour, ParkStatePath: dir + "/parked.expiry", Logger: discardLogger()}

	// The first daemon stops with k parked in NVMe, left to go.
	c1, _, st1 := openParkChain(t, dir, cfg)
	if err := st1.Put(nk(k), blockFor(k, bs)); err != nil {
		t.Fatal(err)
	}
	c1.Park(k)
	c1.parkMu.Lock()
	c1.parked[k] = time.Now().Add(left)
	c1.parkMu.Unlock()
	c1.Wait()
	if err := st1.Close(); err != nil {
		t.Fatal(err)
	}

	// The second one runs without its NVMe tier, and stops cleanly.
	h2, err := NewHost(make([]byte, 4<<20), HostConfig{SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := NewChain(h2, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	c2.Start(ctx2)
	cancel2()
	c2.Wait()

	// The third one has its NVMe tier back.
	c, _, st := openParkChain(t, dir, cfg)
	defer st.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); c.Wait() }()
	now := time.Now()
	c.Start(ctx)
	c.parkMu.Lock()
	exp, ok := c.parked[k]
	c.parkMu.Unlock()
	if !ok {
		t.Fatal("parked block not recorded after the restarts")
	}
	if got := exp.Sub(now); got > left+time.Minute/2 || got < left-time.Minute/2 {
		t.Errorf("after a run without the nvme tier the parked block expires in %v, want %v: its expiry was lost", got.Round(time.Second), left)
	}
}
