package daemon

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// openMetricsSession dials md and opens a namespace of bs-byte blocks.
func openMetricsSession(t *testing.T, md *metricsDaemon, bs int) (context.Context, *client.Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c, err := client.Dial(ctx, client.Options{Socket: md.cfg.Socket, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.Open(ctx, client.Namespace{ModelID: "truth", Layers: 1, KVHeads: 1, HeadDim: 64, DType: "fp16",
		TokensPerBlock: 16, TPSize: 1, BlockBytes: uint64(bs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return ctx, s
}

// TestHostMissCountedOnceWithGPUTier: with the GPU tier on, a get through
// the host API of a block cached nowhere is one host miss (and one NVMe
// miss), as without it; a get of a resident block is one host hit. The
// scrape and the status report agree with the gets.
func TestHostMissCountedOnceWithGPUTier(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // runs after the daemon's cleanup
	if !cudaipc.Emulated {
		t.Skip("needs the emulated GPU build")
	}
	t.Setenv(cudaipc.EnvEmulatedGPUs, "1:64MiB")
	md := startMetricsDaemon(t, true)
	if md.d.gpus == nil {
		t.Fatal("GPU tier off with an emulated GPU")
	}
	addr := md.d.MetricsAddr()
	const bs = 64 << 10
	ctx, s := openMetricsSession(t, md, bs)

	hs := testBlocks(11, 2)
	if _, err := s.Put(ctx, hs[0], block(hs[0], bs)); err != nil {
		t.Fatal(err)
	}
	before := scrape(t, addr)
	dst := make([]byte, bs)
	if err := s.Get(ctx, hs[0], dst); err != nil {
		t.Fatalf("get of a resident block: %v", err)
	}
	if err := s.Get(ctx, hs[1], dst); err == nil {
		t.Fatal("get of a block never put succeeded")
	}
	after := scrape(t, addr)
	for _, tt := range []struct {
		name, tier string
		want       float64
	}{
		{"kvtier_tier_hits_total", "host", 1},
		{"kvtier_tier_misses_total", "host", 1},
		{"kvtier_tier_misses_total", "nvme", 1},
	} {
		if d := after.must(t, tt.name, "tier", tt.tier) - before.must(t, tt.name, "tier", tt.tier); d != tt.want {
			t.Errorf("%s{tier=%q} rose by %v, want %v", tt.name, tt.tier, d, tt.want)
		}
	}
	st := md.d.Stats()
	if m := after.must(t, "kvtier_tier_misses_total", "tier", "host"); m != float64(st.Tiers[0].Misses) {
		t.Errorf("host misses: scrape %v, status %d", m, st.Tiers[0].Misses)
	}
}

// TestParkedGaugeAfterHostEviction: without an NVMe tier a parked request
// stays in the host tier like any block, and the host tier may evict it to
// make room. kvtier_parked_blocks counts the parked blocks the daemon
// holds, so it must come back down with them: without NVMe no TTL pass
// would ever correct it.
func TestParkedGaugeAfterHostEviction(t *testing.T) {
	md := startTruthDaemon(t, false)
	addr := md.d.MetricsAddr()
	const bs = 1 << 20
	ctx, s := openMetricsSession(t, md, bs)

	parked := make([][]byte, 4)
	for i := range parked {
		parked[i] = make([]byte, bs)
	}
	if err := s.Park(ctx, 1, parked); err != nil {
		t.Fatal(err)
	}
	if v := scrape(t, addr).must(t, "kvtier_parked_blocks"); v != 4 {
		t.Fatalf("kvtier_parked_blocks = %v after parking 4 blocks", v)
	}
	// Twice the host tier of newer blocks: the parked ones, least recently
	// used, are evicted.
	hs := testBlocks(5, 64)
	for i, h := range hs {
		if _, err := s.Put(ctx, h, block(h, bs)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if err := s.Resume(ctx, 1, parked); err == nil {
		t.Fatal("the parked request survived a host tier overwritten twice")
	}
	held := 0
	for i := range 4 {
		if md.d.host.Contains(tiers.Key{NS: s.NamespaceID() | tiers.ParkedNS, Hash: shm.Hash{Hi: 1, Lo: uint64(i)}}) {
			held++
		}
	}
	if v := scrape(t, addr).must(t, "kvtier_parked_blocks"); v != float64(held) {
		t.Errorf("kvtier_parked_blocks = %v, the host tier holds %d parked blocks", v, held)
	}
}

// corruptPayload flips bytes of payload where they lie in a segment file
// of the NVMe store under dir.
func corruptPayload(t *testing.T, dir string, payload []byte) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*", "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	probe := payload[len(payload)/2 : len(payload)/2+512]
	for _, p := range segs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		off := bytes.Index(b, probe)
		if off < 0 {
			continue
		}
		for i := range probe {
			b[off+i] ^= 0x5a
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteAt(b[off:off+len(probe)], int64(off))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("payload not found in the segments under %s (%v)", dir, segs)
}

// TestCorruptNVMeGetIsAMiss: a get of a block only in NVMe whose bytes on
// disk fail verification is answered as a miss (docs/metrics.md,
// checksum_miss): it is an NVMe miss, not an NVMe hit, and no promotion.
func TestCorruptNVMeGetIsAMiss(t *testing.T) {
	md := startTruthDaemon(t, true)
	addr := md.d.MetricsAddr()
	const bs = 64 << 10
	ctx, s := openMetricsSession(t, md, bs)

	hs := testBlocks(21, 2)
	for _, h := range hs {
		if _, err := s.Put(ctx, h, block(h, bs)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := md.d.chain.Flush(ctx); err != nil || n != len(hs) {
		t.Fatalf("flush wrote %d blocks, %v", n, err)
	}
	for _, h := range hs { // only in NVMe now
		if !md.d.host.Delete(tiers.Key{NS: s.NamespaceID(), Hash: h}) {
			t.Fatal("block not in the host tier")
		}
	}
	corruptPayload(t, filepath.Join(md.cfg.StateDir, "nvme"), block(hs[0], bs))

	before := scrape(t, addr)
	dst := make([]byte, bs)
	if err := s.Get(ctx, hs[0], dst); err == nil {
		t.Fatal("get of the corrupted block succeeded")
	}
	if err := s.Get(ctx, hs[1], dst); err != nil {
		t.Fatalf("get of the intact block: %v", err)
	}
	after := scrape(t, addr)
	for _, tt := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kvtier_errors_total", []string{"kind", "checksum_miss"}, 1},
		{"kvtier_tier_hits_total", []string{"tier", "nvme"}, 1},   // the intact block
		{"kvtier_tier_misses_total", []string{"tier", "nvme"}, 1}, // the corrupted one
		{"kvtier_tier_misses_total", []string{"tier", "host"}, 2},
		{"kvtier_moves_total", []string{"from", "nvme", "to", "host"}, 1},
	} {
		if d := after.must(t, tt.name, tt.labels...) - before.must(t, tt.name, tt.labels...); d != tt.want {
			t.Errorf("%s%v rose by %v, want %v", tt.name, tt.labels, d, tt.want)
		}
	}
}

// TestHostCapacityAfterReload: a reload of host.capacity makes the smaller
// value the host tier's capacity (the mover keeps the tier under it), so
// kvtier_tier_capacity_bytes{tier="host"} and the status report it, and
// occupancy (resident / capacity) is against it. The NVMe capacity follows
// a reload the same way.
func TestHostCapacityAfterReload(t *testing.T) {
	md := startTruthDaemon(t, true)
	addr := md.d.MetricsAddr()
	next := md.d.Config()
	next.Host.Capacity = 12 * MiB
	next.NVMe.Capacity = 192 * MiB
	if err := md.d.Reload(next); err != nil {
		t.Fatal(err)
	}
	if got := md.d.Config().Host.Capacity; got != 12*MiB {
		t.Fatalf("host.capacity in effect %v after the reload", got)
	}
	f := scrape(t, addr)
	if got := f.must(t, "kvtier_tier_capacity_bytes", "tier", "nvme"); got != 192*MiB {
		t.Errorf("nvme capacity %v after a reload to 192MiB", got)
	}
	if got := f.must(t, "kvtier_tier_capacity_bytes", "tier", "host"); got != 12*MiB {
		t.Errorf("kvtier_tier_capacity_bytes{tier=\"host\"} = %v after a reload to 12MiB", got)
	}
	if got := md.d.Stats().Tiers[0].CapacityBytes; got != 12*MiB {
		t.Errorf("status: host capacity %d after a reload to 12MiB", got)
	}
}

// TestParkedGaugeAfterCorruptDrop: a parked block written through to NVMe
// whose bytes fail verification when the request is resumed is dropped
// (the resume fails). kvtier_parked_blocks then counts the parked blocks
// the daemon still holds, not the one it dropped.
func TestParkedGaugeAfterCorruptDrop(t *testing.T) {
	md := startTruthDaemon(t, true)
	addr := md.d.MetricsAddr()
	const bs = 64 << 10
	ctx, s := openMetricsSession(t, md, bs)

	const req = 7
	blocks := make([][]byte, 2)
	keys := make([]tiers.Key, len(blocks))
	for i := range blocks {
		blocks[i] = block(client.Hash{Hi: 0xfeed, Lo: uint64(i)}, bs)
		keys[i] = tiers.Key{NS: s.NamespaceID() | tiers.ParkedNS, Hash: shm.Hash{Hi: req, Lo: uint64(i)}}
	}
	if err := s.Park(ctx, req, blocks); err != nil {
		t.Fatal(err)
	}
	// Written through: the parked blocks leave the host tier for NVMe.
	for deadline := time.Now().Add(10 * time.Second); md.d.host.Contains(keys[0]) || md.d.host.Contains(keys[1]); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("parked blocks not written through to NVMe")
		}
	}
	corruptPayload(t, filepath.Join(md.cfg.StateDir, "nvme"), blocks[0])
	dsts := [][]byte{make([]byte, bs), make([]byte, bs)}
	if err := s.Resume(ctx, req, dsts); err == nil {
		t.Fatal("resume of a request with a corrupted block succeeded")
	}
	f := scrape(t, addr)
	if v := f.must(t, "kvtier_errors_total", "kind", "checksum_miss"); v != 1 {
		t.Fatalf("checksum misses %v, want 1", v)
	}
	held := 0
	for _, k := range keys {
		if md.d.host.Contains(k) || md.d.nvme.Contains(nvme.Key{NS: k.NS, Hash: k.Hash}) {
			held++
		}
	}
	if held != 1 {
		t.Fatalf("%d of the parked blocks held after the corrupted one was dropped, want 1", held)
	}
	if v := f.must(t, "kvtier_parked_blocks"); v != float64(held) {
		t.Errorf("kvtier_parked_blocks = %v, the daemon holds %d parked blocks", v, held)
	}
}

// TestHandshakeCutByShutdownNotCounted: a peer still in its handshake when
// the daemon stops is refused for the shutdown (code shutdown, as one that
// connects after it), which kvtier_errors_total{kind="refused_connection"}
// does not count: an operator's restart is not a misbehaving peer.
func TestHandshakeCutByShutdownNotCounted(t *testing.T) {
	md := startTruthDaemon(t, false)
	raw, err := net.Dial("unixpacket", md.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	// Wait until the daemon reads the peer's hello (which never comes).
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		st := string(buf[:runtime.Stack(buf, true)])
		if strings.Contains(st, "daemon.(*Daemon).serveConn") && strings.Contains(st, "shm.RecvMsg") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon never waited for the hello")
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- md.stop() }()
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := raw.Read(buf)
	if err != nil {
		t.Fatalf("no refusal: %v", err)
	}
	raw.Close()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	typ, _, payload, err := shm.DecodeMsg(buf[:n])
	if err != nil || typ != shm.MsgError {
		t.Fatalf("reply type %d, %v; want an error message", typ, err)
	}
	e, err := shm.DecodeError(payload)
	if err != nil {
		t.Fatal(err)
	}
	if e.Code != shm.CodeShutdown {
		t.Errorf("refused with code %d (%q), want shutdown (%d)", e.Code, e.Message, shm.CodeShutdown)
	}
	if v := md.d.metrics.refused.Load(); v != 0 {
		t.Errorf("refused_connection = %d after a shutdown cut a handshake, want 0", v)
	}
}

// startTruthDaemon starts a metrics daemon without emulated GPUs (NVMe on
// or off) and checks for leaked goroutines after it stopped.
func startTruthDaemon(t *testing.T, nvmeOn bool) *metricsDaemon {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	t.Setenv(cudaipc.EnvEmulatedGPUs, "")
	return startMetricsDaemon(t, nvmeOn)
}

// TestPeerHangingUpBeforeHelloNotCounted: a peer that connects and hangs up
// without a word (a health check probing the socket, a client killed while
// dialling) was refused as a bad handshake ("EOF") and counted in
// kvtier_errors_total{kind="refused_connection"}, an alerting metric meant
// for refusals. A hello that is malformed is still counted.
func TestPeerHangingUpBeforeHelloNotCounted(t *testing.T) {
	md := startTruthDaemon(t, false)
	// handled waits until every connection made so far has been served: an
	// admin handshake after them is answered only once the accept loop
	// took them (it accepts in order), then no serveConn may be left.
	handled := func() {
		t.Helper()
		admin, err := net.Dial("unixpacket", md.cfg.Socket)
		if err != nil {
			t.Fatal(err)
		}
		h := shm.Hello{PID: uint32(os.Getpid()), Flags: shm.HelloFlagAdmin, Name: "probe"}
		if _, err := admin.Write(shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, h.Encode())); err != nil {
			t.Fatal(err)
		}
		admin.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 1<<20)
		n, err := admin.Read(buf)
		admin.Close()
		if typ, _, _, derr := shm.DecodeMsg(buf[:n]); err != nil || derr != nil || typ != shm.MsgWelcome {
			t.Fatalf("admin handshake: type %d, %v, %v", typ, err, derr)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "daemon.(*Daemon).serveConn") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the daemon still serves a connection after 10s")
			}
		}
	}
	for range 3 {
		raw, err := net.Dial("unixpacket", md.cfg.Socket)
		if err != nil {
			t.Fatal(err)
		}
		raw.Close()
	}
	handled()
	if v := md.d.metrics.refused.Load(); v != 0 {
		t.Errorf("refused_connection = %d after 3 peers hung up before their hello, want 0", v)
	}
	// A peer that speaks, wrongly, is still a refusal.
	raw, err := net.Dial("unixpacket", md.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte("not a hello")); err != nil {
		t.Fatal(err)
	}
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	n, err := raw.Read(buf)
	if err != nil {
		t.Fatalf("no refusal of a malformed hello: %v", err)
	}
	raw.Close()
	handled()
	if typ, _, _, err := shm.DecodeMsg(buf[:n]); err != nil || typ != shm.MsgError {
		t.Fatalf("reply to a malformed hello: type %d, %v; want an error message", typ, err)
	}
	if v := md.d.metrics.refused.Load(); v != 1 {
		t.Errorf("refused_connection = %d after a malformed hello, want 1", v)
	}
}
