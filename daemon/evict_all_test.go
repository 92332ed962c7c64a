package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// TestEvictAllWalksNVMeOnce: kvtierctl evict --all deleted the registered
// namespaces one at a time, twice each (the namespace, then its parked
// requests), and every deletion walked the whole NVMe index under the
// store's lock: with the 65,536 namespaces a registry holds, minutes for
// one request while every read waited between the walks. It is one walk,
// and deletes every block of every namespace, counted once each.
func TestEvictAllWalksNVMeOnce(t *testing.T) {
	cfg := testConfig(t)
	cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 64*MiB
	r := startDaemon(t, cfg, slog.New(slog.DiscardHandler))
	d := r.d
	const n, bs = 300, 4096
	want := 0
	for i := range n {
		id, err := d.reg.Register(rawNS(fmt.Sprintf("evict-all-%d", i), bs))
		if err != nil {
			t.Fatal(err)
		}
		if i%10 != 0 {
			continue
		}
		// In every tenth namespace: a host block, one in NVMe, one in both
		// (counted once), a parked block in each tier.
		for j, where := range []string{"host", "nvme", "both", "parked host", "parked nvme"} {
			k := tiers.Key{NS: id, Hash: shm.Hash{Hi: uint64(i), Lo: uint64(j)}}
			if where == "parked host" || where == "parked nvme" {
				k.NS |= tiers.ParkedNS
			}
			if where != "nvme" && where != "parked nvme" {
				hd, err := d.host.Reserve(k, bs)
				if err != nil {
					t.Fatal(err)
				}
				if err := d.host.Commit(hd); err != nil {
					t.Fatal(err)
				}
			}
			if where == "nvme" || where == "both" || where == "parked nvme" {
				if err := d.nvme.Put(nvme.Key{NS: k.NS, Hash: k.Hash}, make([]byte, bs)); err != nil {
					t.Fatal(err)
				}
			}
			want++
		}
	}
	c := dialDaemon(t, cfg)
	before := d.nvme.Stats().IndexWalks
	got, err := c.Evict(context.Background(), 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if walks := d.nvme.Stats().IndexWalks - before; walks != 1 {
		t.Errorf("evict --all of %d namespaces walked the NVMe index %d times, want 1", n, walks)
	}
	if got != want {
		t.Errorf("evict --all reports %d blocks, want %d", got, want)
	}
	if hb, nb := d.host.Stats().Blocks, d.nvme.Stats().Blocks; hb != 0 || nb != 0 {
		t.Errorf("after evict --all the host tier holds %d blocks, NVMe %d; want none", hb, nb)
	}
}
