package daemon

import (
	"errors"
	"log/slog"
	"strconv"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
)

// openGPUs starts the GPU tier: an arena per GPU, exported once, the host
// arena registered as pinned. Nil (tier off) when disabled, when there is no
// GPU, or when the arenas cannot be set up (logged: the host tier works
// alone).
func openGPUs(cfg Config, chain *tiers.Chain, hostArena []byte, log *slog.Logger) *tiers.GPUSet {
	if !cfg.GPU.Enabled {
		return nil
	}
	devs, err := cudaipc.Devices()
	if errors.Is(err, cudaipc.ErrNoDevice) {
		log.Info("no GPU found; GPU tier off", "reason", err)
		return nil
	}
	if err != nil {
		log.Error("GPU enumeration failed; GPU tier off", "err", err)
		return nil
	}
	slab := int64(cfg.GPU.SlabBytes)
	if slab == 0 {
		slab = int64(cfg.Host.SlabBytes)
	}
	sizes := make([]int64, len(devs))
	for i, d := range devs {
		sizes[i] = int64(cfg.GPU.ArenaBytes)
		if sizes[i] == 0 {
			free, _, err := d.MemInfo()
			if err != nil {
				log.Error("GPU memory info failed; GPU tier off", "gpu", i, "err", err)
				closeDevices(devs)
				return nil
			}
			sizes[i] = int64(float64(free) * cfg.GPU.ArenaFraction)
		}
	}
	gs, err := tiers.NewGPUSet(chain, hostArena, devs, sizes, tiers.GPUConfig{
		SlabBytes: slab, Align: hostAlign,
		HighWatermark: cfg.GPU.HighWatermark, LowWatermark: cfg.GPU.LowWatermark,
		Logger: log.With("tier", "gpu"),
	})
	if err != nil {
		log.Error("GPU tier unavailable; running without it", "err", err)
		closeDevices(devs)
		return nil
	}
	for _, g := range gs.GPUs {
		info := g.Dev.Info()
		log.Info("gpu tier ready", "gpu", info.Ordinal, "uuid", info.UUID.String(), "name", info.Name,
			"arena", ByteSize(g.Arena.Size()).String(), "emulated", cudaipc.Emulated)
	}
	return gs
}

func closeDevices(devs []cudaipc.Device) {
	for _, d := range devs {
		d.Close()
	}
}

// gpuArenaFor returns the MsgGPUArena for a client on the GPU with uuid.
func (d *Daemon) gpuArenaFor(uuid [16]byte) (int, *shm.GPUArena) {
	if d.gpus == nil || uuid == ([16]byte{}) {
		return -1, nil
	}
	i, ok := d.gpus.ByUUID(cudaipc.UUID(uuid))
	if !ok {
		return -1, nil
	}
	g := d.gpus.GPUs[i]
	slab := d.gpus.Stats().Devices[i].SlabBytes
	return i, &shm.GPUArena{UUID: uuid, Size: uint64(g.Arena.Size()), SlabBytes: uint64(slab), Handle: g.Handle}
}

// deleteNS drops a namespace from every tier, with its parked requests
// (an operator's evict: a model's parked KV is no better than its cache).
func (d *Daemon) deleteNS(ns uint32) int { return d.deleteNamespaces([]uint32{ns}) }

// deleteNamespaces is deleteNS of each of ids, in one pass over each tier:
// one per namespace walked the NVMe index once each, under its lock, and
// an evict of everything names every registered namespace.
func (d *Daemon) deleteNamespaces(ids []uint32) int {
	nss := make(map[uint32]struct{}, 2*len(ids))
	for _, id := range ids {
		nss[id], nss[id|tiers.ParkedNS] = struct{}{}, struct{}{}
	}
	if d.gpus != nil {
		return d.gpus.DeleteNamespaces(nss)
	}
	return d.chain.DeleteNamespaces(nss)
}

// dropInUse removes from ids every namespace in use: with a session open,
// or a block in any tier (GPU, host with its reservations, quarantined
// ones included, NVMe, parked, in flight between them). The full registry
// reclaims the rest (Registry.setReclaim). Sessions first: a namespace
// with none gets no new block but by moves down the tiers, which each
// walk below sees (Chain.Namespaces). A session still being opened is not
// listed yet; the registry's grace period covers it.
func (d *Daemon) dropInUse(ids map[uint32]struct{}) {
	d.mu.Lock()
	for _, s := range d.sessions {
		delete(ids, s.nsID)
	}
	d.mu.Unlock()
	drop := func(ns uint32) { delete(ids, ns&^tiers.ParkedNS) }
	if d.gpus != nil {
		d.gpus.Namespaces(drop)
	} else {
		d.chain.Namespaces(drop)
	}
}

// tierOf is the wire tier of a handle held by a session.
func (d *Daemon) tierOf(hd *tiers.Handle) shm.Tier {
	if hd.Owner() != d.host {
		return shm.TierGPU
	}
	return shm.TierHost
}

// gpuTierName is the tier name (status row, metrics tier label) of GPU i.
func gpuTierName(i int) string { return "gpu" + strconv.Itoa(i) }

// gpuStats adds a tier row per GPU arena and the GPU movement rows. The
// rows follow the host (and nvme) rows: readers of Stats take Tiers[0] as
// the host tier.
func (d *Daemon) gpuStats(st *shm.Stats) {
	if d.gpus == nil {
		return
	}
	gst := d.gpus.Stats()
	for i, hs := range gst.Devices {
		ratio := 0.0
		if hs.Hits+hs.Misses > 0 {
			ratio = float64(hs.Hits) / float64(hs.Hits+hs.Misses)
		}
		st.Tiers = append(st.Tiers, shm.TierStats{
			Name: gpuTierName(i), CapacityBytes: hs.CapacityBytes, UsedBytes: hs.UsedBytes, Blocks: hs.Blocks,
			Reserved: hs.Reserved, Leased: hs.Leased, Hits: hs.Hits, Misses: hs.Misses,
			Evictions: hs.Evictions, HitRatio: ratio, Demotions: gst.Demotions[i],
			PromotionFallbacks: gst.PromotionFallbacks[i],
			Compactions:        hs.Compactions, CompactedBlocks: hs.CompactedBlocks,
		})
	}
	move := func(from, to string, m tiers.MoveStats) shm.MoveStats {
		return shm.MoveStats{From: from, To: to, Blocks: m.Blocks, Bytes: m.Bytes, Errors: m.Errors, Seconds: m.Time.Seconds()}
	}
	st.Moves = append(st.Moves,
		move("gpu", "host", gst.GPUToHost),
		move("host", "gpu", gst.HostToGPU),
		move("gpu", "gpu", gst.GPUToGPU),
	)
}
