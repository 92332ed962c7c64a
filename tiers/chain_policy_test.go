package tiers

import (
	"context"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// TestDemotionFollowsPolicy: the mover asks the replacement policy which
// host block to demote. On one chain, LRU demotes the head (the oldest
// block) while the chain-aware default demotes the tail, which keeps the
// prefix reachable.
func TestDemotionFollowsPolicy(t *testing.T) {
	for _, tt := range []struct {
		policy  string
		victim  int // index in the chain of the block demoted first
		keptPos int
	}{
		{"lru", 0, 4},
		{"chain", 4, 0},
	} {
		t.Run(tt.policy, func(t *testing.T) {
			const bs = 64 << 10
			arena := make([]byte, 8<<20)
			h, err := NewHost(arena, HostConfig{SlabBytes: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			store, err := nvme.Open(context.Background(), nvme.Options{Dir: t.TempDir() + "/nvme", CapacityBytes: nvme.MinCapacity})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			c, err := NewChain(h, store, ChainConfig{Policy: tt.policy})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			c.Start(ctx)
			defer func() { cancel(); c.Wait() }()

			chain := make([]Key, 5)
			for i := range chain {
				chain[i] = Key{NS: 1, Hash: shm.Hash{Hi: 9, Lo: uint64(i)}}
			}
			for i, k := range chain {
				hd, err := c.Reserve(k, bs)
				if err != nil {
					t.Fatal(err)
				}
				if err := h.Commit(hd); err != nil {
					t.Fatal(err)
				}
				c.Inserted(k, ChainInfo(chain, i, 1, 0))
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				c.pmu.Lock()
				n := c.pol.Len()
				c.pmu.Unlock()
				if n == len(chain) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("policy saw %d of %d blocks", n, len(chain))
				}
				time.Sleep(time.Millisecond)
			}
			c.demoteMu.Lock()
			moved := c.demoteBatch(1)
			c.demoteMu.Unlock()
			if moved != 1 {
				t.Fatalf("demoted %d blocks, want 1", moved)
			}
			if h.Contains(chain[tt.victim]) || !store.Contains(nvme.Key(chain[tt.victim])) {
				t.Fatalf("%s: block %d should have moved to nvme", tt.policy, tt.victim)
			}
			if !h.Contains(chain[tt.keptPos]) {
				t.Fatalf("%s: block %d should still be in the host tier", tt.policy, tt.keptPos)
			}
			if c.PolicyName() != tt.policy {
				t.Fatalf("policy %q, want %q", c.PolicyName(), tt.policy)
			}
		})
	}
	if _, err := NewChain(mustHost(t), nil, ChainConfig{Policy: "nope"}); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

func mustHost(t *testing.T) *Host {
	h, err := NewHost(make([]byte, 2<<20), HostConfig{SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestRefusedBlocksDropFirst: a block the policy does not admit (an orphan:
// its parent is not cached) is the first to go when the mover needs room,
// and it is dropped rather than written to NVMe.
func TestRefusedBlocksDropFirst(t *testing.T) {
	const bs = 64 << 10
	h, err := NewHost(make([]byte, 8<<20), HostConfig{SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	store, err := nvme.Open(context.Background(), nvme.Options{Dir: t.TempDir() + "/nvme", CapacityBytes: nvme.MinCapacity})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := NewChain(h, store, ChainConfig{Policy: "chain"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	defer func() { cancel(); c.Wait() }()

	head := Key{NS: 1, Hash: shm.Hash{Hi: 1, Lo: 1}}
	orphan := Key{NS: 1, Hash: shm.Hash{Hi: 2, Lo: 2}}
	missingParent := Key{NS: 1, Hash: shm.Hash{Hi: 3, Lo: 3}}
	for _, k := range []Key{head, orphan} {
		hd, err := c.Reserve(k, bs)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Commit(hd); err != nil {
			t.Fatal(err)
		}
	}
	c.Inserted(head, ChainInfo([]Key{head}, 0, 1, 0))
	c.Inserted(orphan, ChainInfo([]Key{missingParent, orphan}, 1, 2, 0))
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.pmu.Lock()
		n, refused := c.pol.Len(), len(c.unadmittedSet)
		c.pmu.Unlock()
		if n == 1 && refused == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("policy holds %d blocks and refused %d; want 1 and 1", n, refused)
		}
		time.Sleep(time.Millisecond)
	}
	c.demoteMu.Lock()
	moved := c.demoteBatch(1)
	c.demoteMu.Unlock()
	if moved != 1 || h.Contains(orphan) || !h.Contains(head) {
		t.Fatalf("moved %d; orphan in host %v, head in host %v: want the orphan gone, the head kept", moved, h.Contains(orphan), h.Contains(head))
	}
	if store.Contains(nvme.Key(orphan)) {
		t.Fatal("a refused block was written to nvme")
	}
	if st := c.Stats(); st.RefusedDrops != 1 || st.Demoted != 0 {
		t.Fatalf("refused drops %d, demoted %d; want 1 and 0", st.RefusedDrops, st.Demoted)
	}
}
