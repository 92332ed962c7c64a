package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
)

// fakeFdStore is systemd's side of sd_notify(3) with an fd store: it keeps
// the fds sent with FDSTORE=1 under their FDNAME (one copy per file, as
// systemd does) and drops them on FDSTOREREMOVE=1.
type fakeFdStore struct {
	t    *testing.T
	conn *net.UnixConn
	done chan struct{}

	mu    sync.Mutex
	fds   []storedFd
	msgs  []string
	synce chan struct{}
}

type storedFd struct {
	name string
	f    *os.File
}

func newFakeFdStore(t *testing.T) *fakeFdStore {
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	s := &fakeFdStore{t: t, conn: conn, done: make(chan struct{})}
	go s.loop()
	t.Cleanup(func() {
		conn.Close()
		<-s.done
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, sf := range s.fds {
			sf.f.Close()
		}
	})
	return s
}

func (s *fakeFdStore) loop() {
	defer close(s.done)
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(16*4))
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		var fds []int
		if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, cm := range cms {
				if r, err := unix.ParseUnixRights(&cm); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		s.handle(string(buf[:n]), fds)
	}
}

func (s *fakeFdStore) handle(msg string, fds []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if msg == "SYNC" {
		close(s.synce)
		return
	}
	s.msgs = append(s.msgs, msg)
	vars := map[string]string{}
	for _, l := range strings.Split(msg, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			vars[k] = v
		}
	}
	if vars["FDSTOREREMOVE"] == "1" {
		kept := s.fds[:0]
		for _, sf := range s.fds {
			if sf.name == vars["FDNAME"] {
				sf.f.Close()
			} else {
				kept = append(kept, sf)
			}
		}
		s.fds = kept
	}
	for _, fd := range fds {
		if vars["FDSTORE"] != "1" || s.holds(fd) {
			unix.Close(fd)
			continue
		}
		s.fds = append(s.fds, storedFd{vars["FDNAME"], os.NewFile(uintptr(fd), vars["FDNAME"])})
	}
}

// holds reports whether the store already has fd's file. Callers hold mu.
func (s *fakeFdStore) holds(fd int) bool {
	var a unix.Stat_t
	if unix.Fstat(fd, &a) != nil {
		return false
	}
	for _, sf := range s.fds {
		var b unix.Stat_t
		if unix.Fstat(int(sf.f.Fd()), &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino {
			return true
		}
	}
	return false
}

// sync waits until every message sent before it has been handled.
func (s *fakeFdStore) sync() {
	s.t.Helper()
	ch := make(chan struct{})
	s.mu.Lock()
	s.synce = ch
	s.mu.Unlock()
	c, err := net.DialUnix("unixgram", nil, s.conn.LocalAddr().(*net.UnixAddr))
	if err != nil {
		s.t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("SYNC")); err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		s.t.Fatal("fake fd store did not handle SYNC")
	}
}

// names lists the stored fds' names in order.
func (s *fakeFdStore) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, sf := range s.fds {
		out = append(out, sf.name)
	}
	return out
}

// pass returns duplicates of the stored fds, named, as activation.Files
// would on the next start.
func (s *fakeFdStore) pass() []*os.File {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*os.File
	for _, sf := range s.fds {
		fd, err := unix.FcntlInt(sf.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			s.t.Fatal(err)
		}
		out = append(out, os.NewFile(uintptr(fd), sf.name))
	}
	return out
}

// file returns the stored fd named name (nil if none); the store owns it.
func (s *fakeFdStore) file(name string) *os.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sf := range s.fds {
		if sf.name == name {
			return sf.f
		}
	}
	return nil
}

// withStoredFiles makes the next daemon start receive files.
func withStoredFiles(t *testing.T, files []*os.File) {
	old := storedFiles
	storedFiles = func() []*os.File {
		storedFiles = old
		return files
	}
	t.Cleanup(func() { storedFiles = old })
}

func warmPayload(i, n int) []byte {
	b := make([]byte, n)
	x := uint64(i)*0x9e3779b97f4a7c15 + 1
	for j := 0; j+8 <= n; j += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[j:], x)
	}
	return b
}

func putWarm(t *testing.T, socket string, n, bs int) {
	t.Helper()
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: socket, Name: "warm-put"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, testNamespace(bs))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range n {
		if ok, err := s.Put(ctx, testHash(i), warmPayload(i, bs)); err != nil || !ok {
			t.Fatalf("put %d: stored %v, %v", i, ok, err)
		}
	}
}

// getWarm returns which of blocks 0..n-1 are served byte-exact; any other
// answer than exact bytes or a miss fails the test.
func getWarm(t *testing.T, socket string, n, bs int) []bool {
	t.Helper()
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: socket, Name: "warm-get"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, testNamespace(bs))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make([]bool, n)
	dst := make([]byte, bs)
	for i := range n {
		err := s.Get(ctx, testHash(i), dst)
		switch {
		case errors.Is(err, client.ErrNotFound):
		case err != nil:
			t.Fatalf("get %d: %v", i, err)
		case !bytes.Equal(dst, warmPayload(i, bs)):
			t.Fatalf("block %d served with wrong bytes", i)
		default:
			got[i] = true
		}
	}
	return got
}

func count(b []bool) int {
	n := 0
	for _, v := range b {
		if v {
			n++
		}
	}
	return n
}

// TestWarmRestartInProcess runs the whole fd-store cycle in process: a
// daemon stores its arena and, at stop, an index snapshot; the next one
// adopts the blocks (one of them corrupted meanwhile, and dropped), stores
// the arena again and removes the index; a crash then leaves the arena
// without an index, and the third start adopts nothing and discards it.
func TestWarmRestartInProcess(t *testing.T) {
	store := newFakeFdStore(t)
	cfg := testConfig(t)
	const n, bs = 40, 64 * KiB

	r1 := startDaemon(t, cfg, nil)
	putWarm(t, cfg.Socket, n, bs)
	r1.stop(t)
	store.sync()
	if got := store.names(); strings.Join(got, ",") != fdNameArena+","+fdNameIndex {
		t.Fatalf("fd store holds %v after a clean stop, want arena and index", got)
	}

	// Corrupt block 7 in the kept arena.
	arenaF := store.file(fdNameArena)
	mem, err := unix.Mmap(int(arenaF.Fd()), 0, int(cfg.Host.Capacity), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(mem, warmPayload(7, bs))
	if at < 0 {
		t.Fatal("block 7 not found in the kept arena")
	}
	mem[at+bs/2] ^= 0x40
	unix.Munmap(mem)

	withStoredFiles(t, store.pass())
	r2 := startDaemon(t, cfg, nil)
	if r2.d.warm.adopted != n-1 || r2.d.warm.dropped != 1 || r2.d.warm.adoptedBytes != int64((n-1)*bs) {
		t.Fatalf("adopted %d blocks (%d bytes), dropped %d; want %d, 1", r2.d.warm.adopted, r2.d.warm.adoptedBytes, r2.d.warm.dropped, n-1)
	}
	got := getWarm(t, cfg.Socket, n, bs)
	if got[7] || count(got) != n-1 {
		t.Fatalf("served %d blocks (block 7: %v); want all but the corrupted block 7", count(got), got[7])
	}
	if err := checkHostTier(r2.d); err != nil {
		t.Fatal(err)
	}
	store.sync()
	if got := store.names(); strings.Join(got, ",") != fdNameArena {
		t.Fatalf("fd store holds %v while serving, want the arena alone", got)
	}

	// A crash: Run never reaches the snapshot. Simulate by abandoning the
	// store's view (the daemon is stopped, but the index it would store is
	// discarded before the next start).
	r2.stop(t)
	store.sync()
	store.mu.Lock()
	kept := store.fds[:0]
	for _, sf := range store.fds {
		if sf.name == fdNameIndex {
			sf.f.Close()
			continue
		}
		kept = append(kept, sf)
	}
	store.fds = kept
	store.mu.Unlock()
	withStoredFiles(t, store.pass())
	r3 := startDaemon(t, cfg, nil)
	if r3.d.warm.fromStore || !r3.d.warm.dropArena || r3.d.warm.adopted != 0 {
		t.Fatalf("after a crash: arena from store %v (dropped %v), adopted %d; want a fresh arena and no block",
			r3.d.warm.fromStore, r3.d.warm.dropArena, r3.d.warm.adopted)
	}
	if got := getWarm(t, cfg.Socket, n, bs); count(got) != 0 {
		t.Fatalf("%d blocks served without an index", count(got))
	}
	r3.stop(t)

	// Another capacity: the stored arena is discarded and replaced.
	store.sync()
	withStoredFiles(t, store.pass())
	cfg4 := cfg
	cfg4.Host.Capacity = 16 * MiB
	r4 := startDaemon(t, cfg4, nil)
	if r4.d.warm.fromStore || r4.d.warm.adopted != 0 || !r4.d.warm.dropArena {
		t.Fatalf("a stored arena of another size was used: %+v", r4.d.warm)
	}
	// Run stores the arena after READY; no client op orders it here.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		store.sync()
		got := store.names()
		if strings.Join(got, ",") == fdNameArena && store.file(fdNameArena) != nil {
			var st unix.Stat_t
			if unix.Fstat(int(store.file(fdNameArena).Fd()), &st) == nil && st.Size == int64(16*MiB) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("fd store holds %v, want the new 16 MiB arena alone", got)
		}
	}
	r4.stop(t)
}

// TestWarmRestartAutoCapacity: with host.capacity unset (the shipped
// config, the README's daemon) the arena is sized from available memory,
// which the arena systemd holds across a restart makes smaller. The next
// start keeps the stored arena's size and its blocks; it used to size a
// smaller arena, discard the stored one and start cold.
func TestWarmRestartAutoCapacity(t *testing.T) {
	store := newFakeFdStore(t)
	const n, bs = 20, 64 * KiB
	autoCfg := func(avail uint64) Config {
		cfg := testConfig(t)
		cfg.Host.Capacity = 0
		fakeEnv(os.Geteuid(), nil, memInfo{Total: 32 * MiB, Available: avail}).derive(&cfg)
		return cfg
	}
	cfg := autoCfg(32 * MiB) // a quarter of 32MiB: 8MiB
	if cfg.Host.Capacity != 8*MiB {
		t.Fatalf("auto capacity %v, want 8MiB", cfg.Host.Capacity)
	}
	r1 := startDaemon(t, cfg, nil)
	putWarm(t, cfg.Socket, n, bs)
	r1.stop(t)
	store.sync()

	// The kept arena is resident: half of what is available now is 6MiB.
	cfg2 := autoCfg(12 * MiB)
	cfg2.RuntimeDir, cfg2.StateDir, cfg2.Socket = cfg.RuntimeDir, cfg.StateDir, cfg.Socket
	withStoredFiles(t, store.pass())
	r2 := startDaemon(t, cfg2, nil)
	if !r2.d.warm.fromStore || r2.d.warm.adopted != n {
		t.Fatalf("arena from the store %v, %d blocks adopted (want %d); capacity %v", r2.d.warm.fromStore, r2.d.warm.adopted, n, r2.d.Config().Host.Capacity)
	}
	if got := r2.d.Config().Host.Capacity; got != 8*MiB {
		t.Errorf("host.capacity in effect %v, want the stored arena's 8MiB", got)
	}
	if got := getWarm(t, cfg.Socket, n, bs); count(got) != n {
		t.Errorf("served %d of %d blocks after the restart", count(got), n)
	}
	r2.stop(t)
}

// TestWarmNoSystemd: without NOTIFY_SOCKET nothing is stored and nothing
// breaks.
func TestWarmNoSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	cfg := testConfig(t)
	r := startDaemon(t, cfg, nil)
	putWarm(t, cfg.Socket, 4, 64*KiB)
	r.stop(t)
}

// checkHostTier checks that every committed host block is readable where
// the tier says and that the tier's counters agree.
func checkHostTier(d *Daemon) error {
	hs := d.host.PinAll()
	defer func() {
		for _, hd := range hs {
			d.host.Unpin(hd, false)
		}
	}()
	st := d.host.Stats()
	if st.Blocks != len(hs) {
		return errors.New("host stats disagree with its index")
	}
	return nil
}

func testSnapshot(t *testing.T) (snapshotHeader, []warmBlock, []byte) {
	t.Helper()
	h := snapshotHeader{arenaSize: 1 << 20, slabBytes: 256 << 10, align: hostAlign, epoch: 0x1234567}
	arena := make([]byte, h.arenaSize)
	for i := range arena {
		arena[i] = byte(i * 7)
	}
	blocks := []warmBlock{
		{key: tiers.Key{NS: 1, Hash: shm.Hash{Hi: 1, Lo: 2}}, off: 0, size: 4096},
		{key: tiers.Key{NS: 2, Hash: shm.Hash{Hi: 3, Lo: 4}}, off: 256 << 10, size: 100000},
		{key: tiers.Key{NS: 1 | tiers.ParkedNS, Hash: shm.Hash{Hi: 5, Lo: 6}}, off: 768 << 10, size: 256 << 10},
	}
	checksumBlocks(arena, blocks)
	return h, blocks, encodeSnapshot(h, blocks)
}

func TestSnapshotRoundTrip(t *testing.T) {
	h, blocks, data := testSnapshot(t)
	got, err := parseSnapshot(data, h)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(blocks) {
		t.Fatalf("%d blocks, want %d", len(got), len(blocks))
	}
	for i := range got {
		if got[i] != blocks[i] {
			t.Errorf("block %d = %+v, want %+v", i, got[i], blocks[i])
		}
	}
	// Empty tier.
	empty := encodeSnapshot(h, nil)
	if got, err := parseSnapshot(empty, h); err != nil || len(got) != 0 {
		t.Fatalf("empty snapshot: %v, %v", got, err)
	}
}

// TestSnapshotRejects: every inconsistency rejects the whole snapshot.
func TestSnapshotRejects(t *testing.T) {
	le := binary.LittleEndian
	h, _, good := testSnapshot(t)
	reseal := func(b []byte) []byte {
		le.PutUint64(b[len(b)-8:], xxh3.Hash(b[:len(b)-8]))
		return b
	}
	tests := []struct {
		name   string
		mutate func(b []byte) []byte
		want   snapshotHeader
		errSub string
	}{
		{"truncated header", func(b []byte) []byte { return b[:40] }, h, "truncated"},
		{"truncated entry", func(b []byte) []byte { return reseal(b[:len(b)-20]) }, h, "claims"},
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return reseal(b) }, h, "magic"},
		{"newer version", func(b []byte) []byte { le.PutUint32(b[8:], 2); return reseal(b) }, h, "version"},
		{"entry size", func(b []byte) []byte { le.PutUint32(b[12:], 40); return reseal(b) }, h, "entry size"},
		{"flipped bit", func(b []byte) []byte { b[70] ^= 1; return b }, h, "checksum"},
		{"other arena size", nil, snapshotHeader{arenaSize: 2 << 20, slabBytes: h.slabBytes, align: h.align, epoch: h.epoch}, "arena"},
		{"other slab size", nil, snapshotHeader{arenaSize: h.arenaSize, slabBytes: 128 << 10, align: h.align, epoch: h.epoch}, "slabs"},
		{"other registry", nil, snapshotHeader{arenaSize: h.arenaSize, slabBytes: h.slabBytes, align: h.align, epoch: 99}, "epoch"},
		{"count too high", func(b []byte) []byte { le.PutUint64(b[48:], 4); return reseal(b) }, h, "claims"},
		{"count huge", func(b []byte) []byte { le.PutUint64(b[48:], 1<<62); return reseal(b) }, h, "claims"},
		{"reserved field", func(b []byte) []byte { le.PutUint32(b[snapshotHeaderLen+4:], 1); return reseal(b) }, h, "reserved"},
		{"zero size", func(b []byte) []byte { le.PutUint64(b[snapshotHeaderLen+32:], 0); return reseal(b) }, h, "invalid"},
		{"size over a slab", func(b []byte) []byte { le.PutUint64(b[snapshotHeaderLen+32:], 256<<10+1); return reseal(b) }, h, "invalid"},
		{"offset past the arena", func(b []byte) []byte { le.PutUint64(b[snapshotHeaderLen+24:], 1<<20); return reseal(b) }, h, "invalid"},
		{"offset wraps", func(b []byte) []byte { le.PutUint64(b[snapshotHeaderLen+24:], ^uint64(0)-4095); return reseal(b) }, h, "invalid"},
		{"end past the arena", func(b []byte) []byte {
			le.PutUint64(b[snapshotHeaderLen+48*2+24:], 1<<20-4096)
			return reseal(b)
		}, h, "invalid"},
		{"misaligned offset", func(b []byte) []byte { le.PutUint64(b[snapshotHeaderLen+24:], 100); return reseal(b) }, h, "invalid"},
		{"blocks add up past the arena", func(b []byte) []byte {
			// Five whole-slab entries (each alone valid) claim 1.25 MiB
			// of a 1 MiB arena.
			e := b[snapshotHeaderLen : snapshotHeaderLen+48]
			nb := append([]byte{}, b[:len(b)-8]...)
			for i := 0; i < 2; i++ {
				nb = append(nb, e...)
			}
			nb = append(nb, make([]byte, 8)...)
			for i := 0; i < 5; i++ {
				p := nb[snapshotHeaderLen+48*i:]
				le.PutUint64(p[24:], 0)
				le.PutUint64(p[32:], 256<<10)
			}
			le.PutUint64(nb[48:], 5)
			return reseal(nb)
		}, h, "add up"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := append([]byte{}, good...)
			if tt.mutate != nil {
				b = tt.mutate(b)
			}
			got, err := parseSnapshot(b, tt.want)
			if err == nil || !strings.Contains(err.Error(), tt.errSub) {
				t.Fatalf("parse = %d blocks, %v; want an error about %q", len(got), err, tt.errSub)
			}
		})
	}
}

// TestReadSnapshotFile: only a sealed memfd of a plausible size is read.
func TestReadSnapshotFile(t *testing.T) {
	_, _, data := testSnapshot(t)
	fd, err := sealedMemfd("t", data)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "t")
	defer f.Close()
	got, err := readSnapshotFile(f, 1<<20)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read sealed snapshot: %v", err)
	}
	if _, err := readSnapshotFile(f, 4096); err == nil {
		t.Error("snapshot larger than any of a 4 KiB arena was read")
	}
	// Not sealed against writes: refused.
	ufd, err := unix.MemfdCreate("u", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	uf := os.NewFile(uintptr(ufd), "u")
	defer uf.Close()
	uf.Write(data)
	if _, err := readSnapshotFile(uf, 1<<20); err == nil {
		t.Error("unsealed memfd was read")
	}
	// Not a memfd.
	pf, err := os.Create(filepath.Join(t.TempDir(), "snap"))
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	pf.Write(data)
	if _, err := readSnapshotFile(pf, 1<<20); err == nil {
		t.Error("regular file was read")
	}
}

// FuzzParseSnapshot: whatever the bytes, parsing never panics and every
// block it accepts lies inside the arena, aligned and at most a slab.
func FuzzParseSnapshot(f *testing.F) {
	h := snapshotHeader{arenaSize: 1 << 20, slabBytes: 256 << 10, align: hostAlign, epoch: 0x1234567}
	arena := make([]byte, h.arenaSize)
	blocks := []warmBlock{{key: tiers.Key{NS: 1}, off: 0, size: 4096}, {key: tiers.Key{NS: 2}, off: 8192, size: 5000}}
	checksumBlocks(arena, blocks)
	f.Add(encodeSnapshot(h, blocks))
	f.Add(encodeSnapshot(h, nil))
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := parseSnapshot(data, h)
		if err != nil {
			return
		}
		var total int64
		for _, b := range got {
			if b.off < 0 || b.size <= 0 || b.size > h.slabBytes || b.off+b.size > h.arenaSize || b.off%h.align != 0 {
				t.Fatalf("accepted block %+v", b)
			}
			total += b.size
			blockSum(arena, b) // in bounds
		}
		if total > h.arenaSize {
			t.Fatalf("accepted %d bytes of blocks", total)
		}
	})
}

// TestWarmStrayFds: a second arena and an fd of an unknown name passed by
// the store are closed and removed from it; the first arena is used.
func TestWarmStrayFds(t *testing.T) {
	store := newFakeFdStore(t)
	cfg := testConfig(t)
	r1 := startDaemon(t, cfg, nil)
	putWarm(t, cfg.Socket, 4, 64*KiB)
	r1.stop(t)
	store.sync()
	for _, name := range []string{fdNameArena, "kvtier-something-old"} {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		store.mu.Lock()
		store.fds = append(store.fds, storedFd{name, os.NewFile(uintptr(fd), name)})
		store.mu.Unlock()
	}
	withStoredFiles(t, store.pass())
	r2 := startDaemon(t, cfg, nil)
	if !r2.d.warm.fromStore || r2.d.warm.adopted != 4 {
		t.Fatalf("warm state %+v; want the first arena and its 4 blocks", r2.d.warm)
	}
	if got := count(getWarm(t, cfg.Socket, 4, 64*KiB)); got != 4 {
		t.Fatalf("%d blocks served, want 4", got)
	}
	store.sync()
	if got := store.names(); strings.Join(got, ",") != fdNameArena {
		t.Fatalf("fd store holds %v, want the adopted arena alone", got)
	}
	r2.stop(t)
}
