package tiers

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
	"github.com/kvtier/kvtier/tiers/policy"
)

// policyTracks reports how many of keys the replacement policy tracks.
func policyTracks(c *Chain, keys []Key) int {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	n := 0
	for _, k := range keys {
		if _, ok := c.polKeys[pk(k)]; ok {
			n++
		}
	}
	return n
}

// TestPolicyTracksBlocksAdoptedBeforeStart: a warm restart adopts the
// blocks of the kept arena, each one an insert for the policy, before
// Start runs the loop that applies them. Past the event queue's bound
// (65,536) the inserts were dropped, and those blocks were never tracked:
// never picked for demotion, only dropped by the host tier's own eviction,
// unwritten.
func TestPolicyTracksBlocksAdoptedBeforeStart(t *testing.T) {
	const bs, slab = 64, 64 << 10
	const n = 1<<16 + 1024 // past the event queue's bound
	// Twice the blocks' size: under the watermarks, nothing is demoted.
	h, err := NewHost(make([]byte, 2*n*bs), HostConfig{SlabBytes: slab, Align: bs})
	if err != nil {
		t.Fatal(err)
	}
	store, err := nvme.Open(context.Background(), nvme.Options{Dir: filepath.Join(t.TempDir(), "nvme"), CapacityBytes: nvme.MinCapacity, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := NewChain(h, store, ChainConfig{Policy: "lru", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if n <= cap(c.polCh) {
		t.Fatalf("%d blocks fit in the event queue (%d)", n, cap(c.polCh))
	}
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = chainKey(61, uint64(i))
		if err := h.Adopt(keys[i], int64(i)*bs, bs); err != nil { // as daemon.adoptWarm does
			t.Fatal(err)
		}
		c.Inserted(keys[i], policy.AccessInfo{})
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	defer func() { cancel(); c.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for policyTracks(c, keys) < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := policyTracks(c, keys); got != n {
		t.Fatalf("policy tracks %d of %d blocks adopted before Start (%d events dropped)", got, n, c.Stats().PolicyEventDrops)
	}
	if d := c.Stats().PolicyEventDrops; d != 0 {
		t.Errorf("%d policy events dropped", d)
	}
}

// TestPolicyTracksBlockWhoseInsertWasDropped: an insert dropped on a full
// event queue left its block untracked for good (accesses of untracked
// blocks were ignored), so the mover never picked it while the policy had
// victims. A later read of the block enters it.
func TestPolicyTracksBlockWhoseInsertWasDropped(t *testing.T) {
	const bs = 64 << 10
	tests := []struct {
		name  string
		touch func(c *Chain, k Key)
	}{
		{"get", func(c *Chain, k Key) { c.Accessed(k, ChainInfo([]Key{k}, 0, 1, 0)) }},
		{"lookup", func(c *Chain, k Key) { c.Lookup([]Key{k}, make([]shm.Tier, 1)) }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newChainRig(t, rigOpts{hostBytes: 8 << 20, slabBytes: 1 << 20, cfg: ChainConfig{Policy: "lru"}})
			k := chainKey(62, uint64(i))
			// The queue full: policyLoop waits for pmu, and events of a
			// block the tier does not hold fill the queue.
			r.c.pmu.Lock()
			noise := polEvent{op: polAccess, k: pk(chainKey(63, 0))}
		fill:
			for {
				select {
				case r.c.polCh <- noise:
				default:
					break fill
				}
			}
			drops := r.c.Stats().PolicyEventDrops
			r.putHost(t, k, bs)
			r.c.pmu.Unlock()
			if d := r.c.Stats().PolicyEventDrops; d != drops+1 {
				t.Fatalf("%d policy events dropped by the put, want its insert", d-drops)
			}
			eventually(t, 10*time.Second, "policy events not applied", func() bool { return len(r.c.polCh) == 0 })
			if policyTracks(r.c, []Key{k}) != 0 {
				t.Fatal("the policy tracks a block whose insert was dropped")
			}

			tt.touch(r.c, k)
			deadline := time.Now().Add(5 * time.Second)
			for policyTracks(r.c, []Key{k}) == 0 && time.Now().Before(deadline) {
				time.Sleep(2 * time.Millisecond)
			}
			if policyTracks(r.c, []Key{k}) == 0 {
				t.Fatalf("a block whose insert was dropped is still untracked by the policy after a %s of it", tt.name)
			}
		})
	}
}
