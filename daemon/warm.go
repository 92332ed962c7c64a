package daemon

// Warm restart without copying.
//
// Under systemd the host arena is a memfd that outlives the daemon: right
// after it is created (at READY) the daemon stores it in systemd's
// file-descriptor store (sd_notify FDSTORE=1, FDNAME=kvtier-arena; the unit
// sets FileDescriptorStoreMax=). At a clean stop, once sessions and the
// mover are done, it checksums every committed host block and stores a
// small index snapshot, a sealed memfd named kvtier-index. The blocks stay
// where they are. On the next start systemd passes both back (LISTEN_FDS,
// LISTEN_FDNAMES): the daemon maps the stored arena instead of creating one
// (if it is sealed and has the configured size), parses the snapshot
// defensively, and re-adopts each block at its offset after checking its
// checksum; a block that fails any check is dropped. Then it removes the
// index from the store (FDSTOREREMOVE=1) and stores the arena again: a
// daemon that crashes later restarts with the arena but no index: it
// adopts nothing and discards that arena for a fresh one, which the
// crashed daemon's clients (still writing into theirs, perhaps) do not
// map. Outside systemd (no NOTIFY_SOCKET) nothing is stored.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/policy"
)

// Names of the fds kvtierd keeps in systemd's fd store.
const (
	fdNameArena = "kvtier-arena"
	fdNameIndex = "kvtier-index"
)

// hostAlign is the host tier's slot alignment (see New).
const hostAlign = 4096

// storedFiles returns the fds systemd passed from the fd store (named by
// LISTEN_FDNAMES), clearing LISTEN_* so no child inherits them. A var so
// in-process tests can hand fds over without fd 3 and up.
var storedFiles = func() []*os.File { return activation.Files(true) }

// warmState is what New learned from the fd store, for Run.
type warmState struct {
	index        *os.File // the stored index snapshot; closed after adoption
	fromStore    bool     // the arena is the stored one
	dropArena    bool     // a stored arena was discarded: remove it from the store
	hadIndex     bool     // an index was passed: remove it from the store
	kept         bool     // systemd's fd store holds the arena: a next daemon may map it
	remove       []string // other fd names to remove from the store
	adopted      int
	adoptedBytes int64
	dropped      int
}

// openArena maps the host arena systemd kept for us if it is usable, and
// creates a fresh one otherwise.
func (d *Daemon) openArena() (*shm.Region, error) {
	var arena *os.File
	for _, f := range storedFiles() {
		switch {
		case f.Name() == fdNameArena && arena == nil:
			arena = f
		case f.Name() == fdNameIndex && d.warm.index == nil:
			d.warm.index = f
			d.warm.hadIndex = true
		default:
			// A second arena or index, or a name from another version:
			// dropped here and, at READY, from the store (which is small:
			// FileDescriptorStoreMax=).
			d.log.Warn("closing an unexpected fd passed by systemd", "name", f.Name())
			d.warm.remove = append(d.warm.remove, f.Name())
			f.Close()
		}
	}
	capacity := int64(d.cfg.Host.Capacity)
	if arena != nil {
		want := capacity
		if sz, ok := storedArenaSize(arena, int64(d.cfg.Host.SlabBytes)); ok && d.cfg.Host.CapacityAuto {
			// host.capacity unset: sized from available memory, which the
			// stored arena itself holds. Keep the stored size.
			want = sz
		}
		var r *shm.Region
		err := errNoIndex
		if d.warm.index != nil {
			r, err = mapStoredArena(arena, want)
		} else {
			// The previous kvtierd did not stop cleanly: nothing is
			// adopted, and its clients may still write into the arena
			// (a device copy queued into a reservation lands late, and
			// no quarantine held that reservation). A slot handed out
			// from it could be overwritten: a fresh arena, same size.
			arena.Close()
			capacity = want
			d.cfg.Host.Capacity = ByteSize(want)
		}
		if err == nil {
			if want != capacity {
				d.log.Info("host.capacity unset: keeping the size of the host arena kept by systemd",
					"bytes", want, "sized_from_memory", capacity)
				d.cfg.Host.Capacity = ByteSize(want)
			}
			d.warm.fromStore = true
			d.log.Info("using the host arena kept by systemd", "bytes", want, "hugepages", r.Huge)
			return r, nil
		}
		d.log.Warn("discarding the host arena kept by systemd", "err", err)
		d.warm.dropArena = true
	}
	if d.warm.index != nil {
		if arena != nil {
			d.log.Warn("discarding the stored index snapshot with its arena")
		} else {
			d.log.Warn("discarding a stored index snapshot that came without an arena")
		}
		d.warm.index.Close()
		d.warm.index = nil
	}
	return shm.CreateRegion("kvtier-host-arena", capacity, d.cfg.Host.HugePages)
}

// errNoIndex: a stored arena came without an index snapshot.
var errNoIndex = errors.New("no index snapshot came with it (the previous kvtierd did not stop cleanly); its clients may still write into it")

// storedArenaSize returns the size of a stored arena if it is one the
// configuration could have asked for: whole slabs, at least two.
func storedArenaSize(f *os.File, slab int64) (int64, bool) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || slab <= 0 {
		return 0, false
	}
	return st.Size, st.Size%slab == 0 && st.Size >= 2*slab
}

// mapStoredArena maps f (which it closes) after shm.MapRegion's checks: a
// memfd sealed against resizing, of exactly capacity bytes.
func mapStoredArena(f *os.File, capacity int64) (*shm.Region, error) {
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	r, err := shm.MapRegion(fd, capacity, false)
	if err != nil {
		return nil, err
	}
	if shm.IsHugeTLB(r.Fd()) {
		// Kept by an older kvtierd: a client's hole punch in it could
		// SIGBUS the daemon (shm.CreateRegion). Start with a new arena.
		r.Close()
		return nil, errors.New("stored arena is hugetlbfs-backed")
	}
	return r, nil
}

// adoptWarm re-adopts the blocks of the stored index snapshot into the host
// tier (New calls it once the tier chain exists). Every failure drops
// blocks, never the start.
func (d *Daemon) adoptWarm() {
	f := d.warm.index
	if f == nil {
		return
	}
	d.warm.index = nil
	defer f.Close()
	t0 := time.Now()
	data, err := readSnapshotFile(f, int64(d.cfg.Host.Capacity))
	var blocks []warmBlock
	if err == nil {
		blocks, err = parseSnapshot(data, snapshotHeader{
			arenaSize: int64(d.cfg.Host.Capacity), slabBytes: int64(d.cfg.Host.SlabBytes),
			align: hostAlign, epoch: d.reg.Epoch(),
		})
	}
	if err != nil {
		d.log.Warn("warm restart: index snapshot rejected; starting empty", "err", err, "adopted_blocks", 0)
		return
	}
	arena := d.arena.Bytes()
	// Blocks of namespaces this registry does not know, or of another size
	// than their namespace's blocks, are never served: drop them unread.
	invalid := 0
	ok := make([]bool, len(blocks))
	for i, b := range blocks {
		spec, known := d.reg.Lookup(b.key.NS &^ tiers.ParkedNS)
		ok[i] = known && int64(spec.BlockBytes) == b.size
		if !ok[i] {
			invalid++
		}
	}
	verifyBlocks(arena, blocks, ok)
	corrupt := -invalid
	for i := range blocks {
		if !ok[i] {
			corrupt++
		}
	}
	conflicts := 0
	for i, b := range blocks {
		if !ok[i] {
			continue
		}
		if err := d.host.Adopt(b.key, b.off, b.size); err != nil {
			conflicts++
			d.log.Debug("warm restart: block not adopted", "ns", b.key.NS, "hash", b.key.Hash, "err", err)
			continue
		}
		d.warm.adopted++
		d.warm.adoptedBytes += b.size
		if b.key.Parked() {
			d.chain.Park(b.key)
		} else {
			d.chain.Inserted(b.key, policy.AccessInfo{})
		}
	}
	d.warm.dropped = len(blocks) - d.warm.adopted
	d.log.Info("warm restart: host blocks re-adopted from the stored arena",
		"adopted_blocks", d.warm.adopted, "adopted_bytes", d.warm.adoptedBytes,
		"dropped_blocks", d.warm.dropped, "dropped_checksum", corrupt, "dropped_unknown_namespace", invalid,
		"dropped_conflict", conflicts, "took", time.Since(t0).Round(time.Microsecond))
}

// storeArena keeps the host arena in systemd's fd store (Run calls it after
// READY): first it removes a passed index snapshot (now adopted, and stale
// from the first write on) and a passed arena that was discarded.
func (d *Daemon) storeArena() {
	d.warm.kept = d.warm.fromStore // systemd passed it, so it holds it
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return
	}
	if d.warm.hadIndex {
		d.fdStoreNotify("FDSTOREREMOVE=1\nFDNAME="+fdNameIndex, -1)
	}
	removed := map[string]bool{}
	for _, name := range d.warm.remove {
		if name == fdNameArena {
			d.warm.dropArena = true
		}
		if !removed[name] && name != fdNameIndex && name != fdNameArena {
			d.fdStoreNotify("FDSTOREREMOVE=1\nFDNAME="+name, -1)
		}
		removed[name] = true
	}
	if d.warm.dropArena {
		// Every arena by that name goes, ours is stored again below.
		d.fdStoreNotify("FDSTOREREMOVE=1\nFDNAME="+fdNameArena, -1)
	}
	// Storing the same memfd again (a warm restart) is a no-op for systemd.
	if d.fdStoreNotify("FDSTORE=1\nFDNAME="+fdNameArena, d.arena.Fd()) {
		d.warm.kept = true
	}
}

// storeSnapshot writes the index snapshot of the host tier and stores it
// (Run calls it at the end of a stop, when nothing moves blocks any more).
func (d *Daemon) storeSnapshot() {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return
	}
	t0 := time.Now()
	hs := d.host.PinAllOldestFirst()
	blocks := make([]warmBlock, len(hs))
	var bytes int64
	for i, hd := range hs {
		blocks[i] = warmBlock{key: hd.Key, off: hd.Offset, size: hd.Size}
		bytes += hd.Size
	}
	checksumBlocks(d.arena.Bytes(), blocks)
	for _, hd := range hs {
		d.host.Unpin(hd, false)
	}
	data := encodeSnapshot(snapshotHeader{
		arenaSize: d.arena.Size(), slabBytes: int64(d.cfg.Host.SlabBytes), align: hostAlign, epoch: d.reg.Epoch(),
	}, blocks)
	fd, err := sealedMemfd(fdNameIndex, data)
	if err != nil {
		d.log.Warn("warm restart: index snapshot not stored; the next start will be cold", "err", err)
		return
	}
	defer unix.Close(fd)
	d.fdStoreNotify("FDSTOREREMOVE=1\nFDNAME="+fdNameIndex, -1)
	if d.fdStoreNotify("FDSTORE=1\nFDNAME="+fdNameIndex, fd) {
		d.log.Info("warm restart: host tier index stored with systemd", "blocks", len(blocks), "bytes", bytes,
			"snapshot_bytes", len(data), "took", time.Since(t0).Round(time.Microsecond))
	}
}

// fdStoreNotify sends one sd_notify message, with fd attached when fd >= 0
// (go-systemd's SdNotify cannot pass fds). It reports success.
func (d *Daemon) fdStoreNotify(state string, fd int) bool {
	err := sdNotifyFd(state, fd)
	if err != nil {
		d.log.Warn("sd_notify fd store message failed", "state", state, "err", err)
	}
	return err == nil
}

func sdNotifyFd(state string, fd int) error {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return errors.New("NOTIFY_SOCKET not set")
	}
	// An unconnected socket: net refuses WriteMsgUnix on a connected
	// datagram socket. SockaddrUnix maps a leading '@' to the abstract
	// namespace, as systemd means it.
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sock)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	// Never block on a receiver that stopped reading (a wedged manager, a
	// test that failed): the message is dropped and logged instead.
	return unix.Sendmsg(sock, []byte(state), oob, &unix.SockaddrUnix{Name: name}, unix.MSG_DONTWAIT)
}

// sealedMemfd returns a memfd holding data, sealed against any change.
func sealedMemfd(name string, data []byte) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	for off := 0; off < len(data); {
		n, err := unix.Pwrite(fd, data[off:], int64(off))
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("write snapshot: %w", err)
		}
		off += n
	}
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("seal snapshot: %w", err)
	}
	return fd, nil
}

// ---- snapshot format ----
//
// Little-endian. Header (56 bytes): magic "KVTIERIX", version u32, entry
// size u32, arena size u64, slab bytes u64, slot alignment u64, namespace
// registry epoch u64, block count u64. Then count entries of 48 bytes,
// least recently used first: namespace u32, reserved u32 (0), hash hi u64,
// hash lo u64, offset u64, size u64, block checksum u64 (XXH3-64 of the
// block's bytes, seeded with its key). Last, XXH3-64 of everything before.

const (
	snapshotMagic     = "KVTIERIX"
	snapshotVersion   = 1
	snapshotHeaderLen = 56
	snapshotEntryLen  = 48
)

type snapshotHeader struct {
	arenaSize, slabBytes, align int64
	epoch                       uint64
}

type warmBlock struct {
	key       tiers.Key
	off, size int64
	sum       uint64
}

// blockSeed binds a block's checksum to its key: bytes that are intact but
// belong to another key at that offset do not verify.
func blockSeed(k tiers.Key) uint64 {
	return k.Hash.Hi ^ bits.RotateLeft64(k.Hash.Lo, 29) ^ uint64(k.NS)*0x9e3779b97f4a7c15
}

func blockSum(arena []byte, b warmBlock) uint64 {
	return xxh3.HashSeed(arena[b.off:b.off+b.size], blockSeed(b.key))
}

func encodeSnapshot(h snapshotHeader, blocks []warmBlock) []byte {
	buf := make([]byte, snapshotHeaderLen+len(blocks)*snapshotEntryLen+8)
	le := binary.LittleEndian
	copy(buf, snapshotMagic)
	le.PutUint32(buf[8:], snapshotVersion)
	le.PutUint32(buf[12:], snapshotEntryLen)
	le.PutUint64(buf[16:], uint64(h.arenaSize))
	le.PutUint64(buf[24:], uint64(h.slabBytes))
	le.PutUint64(buf[32:], uint64(h.align))
	le.PutUint64(buf[40:], h.epoch)
	le.PutUint64(buf[48:], uint64(len(blocks)))
	p := buf[snapshotHeaderLen:]
	for _, b := range blocks {
		le.PutUint32(p[0:], b.key.NS)
		le.PutUint32(p[4:], 0)
		le.PutUint64(p[8:], b.key.Hash.Hi)
		le.PutUint64(p[16:], b.key.Hash.Lo)
		le.PutUint64(p[24:], uint64(b.off))
		le.PutUint64(p[32:], uint64(b.size))
		le.PutUint64(p[40:], b.sum)
		p = p[snapshotEntryLen:]
	}
	le.PutUint64(p, xxh3.Hash(buf[:len(buf)-8]))
	return buf
}

// maxSnapshotLen bounds a snapshot for an arena of arenaSize: no more blocks
// than aligned slots.
func maxSnapshotLen(arenaSize int64) int64 {
	return snapshotHeaderLen + arenaSize/hostAlign*snapshotEntryLen + 8
}

// readSnapshotFile reads a stored snapshot, refusing one that is not a
// sealed memfd (it could change under the parse) or is larger than any
// snapshot of this arena.
func readSnapshotFile(f *os.File, arenaSize int64) ([]byte, error) {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("not a memfd: %w", err)
	}
	if want := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW; seals&want != want {
		return nil, fmt.Errorf("seals %#x lack write/shrink/grow", seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	if st.Size < snapshotHeaderLen+8 || st.Size > maxSnapshotLen(arenaSize) {
		return nil, fmt.Errorf("snapshot of %d bytes; want %d..%d", st.Size, snapshotHeaderLen+8, maxSnapshotLen(arenaSize))
	}
	buf := make([]byte, st.Size)
	if _, err := f.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	return buf, nil
}

// parseSnapshot decodes data, which must describe an arena like want. It
// checks everything it can without the arena: framing, trailing checksum,
// the arena geometry and registry epoch, every entry's bounds, and that
// the blocks' sizes add up to no more than the arena (so verifying them
// reads at most the arena once). Any inconsistency rejects the whole
// snapshot.
func parseSnapshot(data []byte, want snapshotHeader) ([]warmBlock, error) {
	le := binary.LittleEndian
	if len(data) < snapshotHeaderLen+8 {
		return nil, fmt.Errorf("snapshot truncated: %d bytes", len(data))
	}
	if string(data[:8]) != snapshotMagic {
		return nil, errors.New("bad snapshot magic")
	}
	if v := le.Uint32(data[8:]); v != snapshotVersion {
		return nil, fmt.Errorf("snapshot version %d; this kvtierd reads %d", v, snapshotVersion)
	}
	if n := le.Uint32(data[12:]); n != snapshotEntryLen {
		return nil, fmt.Errorf("snapshot entry size %d, want %d", n, snapshotEntryLen)
	}
	if sum := le.Uint64(data[len(data)-8:]); sum != xxh3.Hash(data[:len(data)-8]) {
		return nil, errors.New("snapshot checksum mismatch")
	}
	got := snapshotHeader{
		arenaSize: int64(le.Uint64(data[16:])), slabBytes: int64(le.Uint64(data[24:])),
		align: int64(le.Uint64(data[32:])), epoch: le.Uint64(data[40:]),
	}
	if got.arenaSize != want.arenaSize || got.slabBytes != want.slabBytes || got.align != want.align {
		return nil, fmt.Errorf("snapshot of a %d-byte arena with %d-byte slabs aligned to %d; configured %d, %d, %d",
			got.arenaSize, got.slabBytes, got.align, want.arenaSize, want.slabBytes, want.align)
	}
	if got.epoch != want.epoch {
		return nil, fmt.Errorf("snapshot of namespace registry epoch %#x; the registry is at %#x", got.epoch, want.epoch)
	}
	count := le.Uint64(data[48:])
	if body := uint64(len(data) - snapshotHeaderLen - 8); body%snapshotEntryLen != 0 || count != body/snapshotEntryLen {
		return nil, fmt.Errorf("snapshot claims %d blocks in %d bytes", count, len(data))
	}
	blocks := make([]warmBlock, count)
	p := data[snapshotHeaderLen:]
	var total uint64
	for i := range blocks {
		if le.Uint32(p[4:]) != 0 {
			return nil, fmt.Errorf("snapshot entry %d: reserved field set", i)
		}
		off, size := le.Uint64(p[24:]), le.Uint64(p[32:])
		arena, slab := uint64(want.arenaSize), uint64(want.slabBytes)
		if size == 0 || size > slab || off > arena || size > arena-off || off%uint64(want.align) != 0 {
			return nil, fmt.Errorf("snapshot entry %d: block [%d, +%d) invalid in a %d-byte arena", i, off, size, arena)
		}
		if total += size; total > arena {
			return nil, fmt.Errorf("snapshot blocks add up to more than the arena")
		}
		blocks[i] = warmBlock{
			key: tiers.Key{NS: le.Uint32(p[0:]), Hash: shm.Hash{Hi: le.Uint64(p[8:]), Lo: le.Uint64(p[16:])}},
			off: int64(off), size: int64(size), sum: le.Uint64(p[40:]),
		}
		p = p[snapshotEntryLen:]
	}
	return blocks, nil
}

// checksumBlocks sets every block's sum, in parallel.
func checksumBlocks(arena []byte, blocks []warmBlock) {
	parallel(len(blocks), func(i int) { blocks[i].sum = blockSum(arena, blocks[i]) })
}

// verifyBlocks clears ok[i] for every block (with ok[i] set) whose bytes do
// not match its checksum, in parallel. Blocks were bounds-checked by
// parseSnapshot.
func verifyBlocks(arena []byte, blocks []warmBlock, ok []bool) {
	parallel(len(blocks), func(i int) {
		if !ok[i] {
			return
		}
		// A fresh mapping: build the block's page tables in one call
		// rather than a fault per page (best effort; Linux >= 5.14).
		b := blocks[i]
		_ = unix.Madvise(arena[b.off:b.off+b.size], unix.MADV_POPULATE_READ)
		if blockSum(arena, b) != b.sum {
			ok[i] = false
		}
	})
}

// parallel runs fn(0..n-1) on up to GOMAXPROCS goroutines.
func parallel(n int, fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}
