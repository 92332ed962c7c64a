package itest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
)

// TestProcessRoundTrip: daemon, writer and reader in three processes; the
// bytes a client process puts are the bytes another process gets.
func TestProcessRoundTrip(t *testing.T) {
	t.Parallel()
	dir := tmpDir(t)
	d := daemonProc(t, dir, nil)
	const bs, n = 256 << 10, 8

	// Child puts, parent reads.
	w := clientProc(t, socketOf(dir), "put", bs, 1, n, nil, "")
	line := w.expect("PUT", 20*time.Second)
	var childNS uint32
	var stored int
	if _, err := fmt.Sscanf(line, "PUT %d %d", &childNS, &stored); err != nil || stored != n {
		t.Fatalf("child put: %q (%v)", line, err)
	}
	if err := w.wait(10 * time.Second); err != nil {
		t.Fatalf("put child: %v", err)
	}

	c := dial(t, socketOf(dir))
	s := open(t, c, testNS("itest", bs))
	if s.NamespaceID() != childNS {
		t.Fatalf("namespace id %d in parent, %d in child", s.NamespaceID(), childNS)
	}
	ctx := context.Background()
	hs := chain(1, n+3) // the child's chain plus 3 uncached blocks
	r, err := s.Lookup(ctx, hs)
	if err != nil || r.Hits != n || len(r.Tiers) != n {
		t.Fatalf("lookup: %+v %v, want %d hits", r, err, n)
	}
	for i, tier := range r.Tiers {
		if tier != client.TierHost {
			t.Errorf("lookup tier[%d] = %v, want host", i, tier)
		}
	}
	dsts := make([][]byte, n+3)
	for i := range dsts {
		dsts[i] = make([]byte, bs)
	}
	found, err := s.GetBatch(ctx, hs, dsts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range hs {
		if found[i] != (i < n) {
			t.Fatalf("get %d: found=%v", i, found[i])
		}
		if i < n && !bytes.Equal(dsts[i], payload(hs[i], bs)) {
			t.Fatalf("block %d: bytes differ from what the child put", i)
		}
	}
	// A duplicate put is a no-op, not an overwrite.
	if ok, err := s.Put(ctx, hs[0], make([]byte, bs)); err != nil || ok {
		t.Fatalf("duplicate put: stored=%v err=%v", ok, err)
	}

	// Parent puts, child reads.
	hs2 := chain(2, 4)
	blocks := make([][]byte, len(hs2))
	for i, h := range hs2 {
		blocks[i] = payload(h, bs)
	}
	if k, err := s.PutBatch(ctx, hs2, blocks); err != nil || k != len(hs2) {
		t.Fatalf("put: %d %v", k, err)
	}
	v := clientProc(t, socketOf(dir), "verify", bs, 2, 4, nil, "")
	line = v.expect("VERIFY", 20*time.Second)
	if want := fmt.Sprintf("VERIFY %d 4 4", s.NamespaceID()); line != want {
		t.Fatalf("child verify: %q, want %q", line, want)
	}
	if err := v.wait(10 * time.Second); err != nil {
		t.Fatalf("verify child: %v", err)
	}
	st := stats(t, c)
	if st.Tiers[0].Blocks != n+len(hs2) || st.SessionsTotal != 3 || st.SessionsBad != 0 {
		t.Fatalf("stats: blocks %d sessions_total %d bad %d", st.Tiers[0].Blocks, st.SessionsTotal, st.SessionsBad)
	}
	s.Close()
	if err := d.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
}

// TestProcessNamespaceIDStable: namespace ids persist in the state dir and
// survive a daemon restart, whatever order clients register in afterwards.
func TestProcessNamespaceIDStable(t *testing.T) {
	t.Parallel()
	dir := tmpDir(t)
	d := daemonProc(t, dir, nil)
	c := dial(t, socketOf(dir))
	a := open(t, c, testNS("model-a", 64<<10))
	b := open(t, c, testNS("model-b", 64<<10))
	idA, idB := a.NamespaceID(), b.NamespaceID()
	if idA == idB {
		t.Fatalf("two namespaces share id %d", idA)
	}
	// Same layout again: same id.
	if a2 := open(t, c, testNS("model-a", 64<<10)); a2.NamespaceID() != idA {
		t.Fatalf("re-registered namespace got id %d, want %d", a2.NamespaceID(), idA)
	}
	c.Close()
	if err := d.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}

	d2 := daemonProc(t, dir, nil)
	c2 := dial(t, socketOf(dir))
	b2 := open(t, c2, testNS("model-b", 64<<10)) // reverse order on purpose
	a2 := open(t, c2, testNS("model-a", 64<<10))
	if a2.NamespaceID() != idA || b2.NamespaceID() != idB {
		t.Fatalf("after restart: a=%d b=%d, before a=%d b=%d", a2.NamespaceID(), b2.NamespaceID(), idA, idB)
	}
	cc := open(t, c2, testNS("model-c", 64<<10))
	if id := cc.NamespaceID(); id == idA || id == idB {
		t.Fatalf("new namespace reused id %d", id)
	}
	st := stats(t, c2)
	ids := map[string]uint32{}
	for _, ns := range st.Namespaces {
		ids[ns.Namespace.ModelID] = ns.ID
	}
	if ids["model-a"] != idA || ids["model-b"] != idB || ids["model-c"] != cc.NamespaceID() || len(ids) != 3 {
		t.Fatalf("stats namespaces %v", ids)
	}
	c2.Close()
	if err := d2.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
}

// TestProcessClientDeath: a client process holding reservations and leases
// is killed with SIGKILL; the daemon gives everything back at once.
func TestProcessClientDeath(t *testing.T) {
	t.Parallel()
	dir := tmpDir(t)
	d := daemonProc(t, dir, nil)
	const bs, nRes, nLease = 1 << 20, 6, 4
	c := dial(t, socketOf(dir))
	s := open(t, c, testNS("itest", bs))
	ctx := context.Background()
	leased := chain(10, nLease)
	blocks := make([][]byte, nLease)
	for i, h := range leased {
		blocks[i] = payload(h, bs)
	}
	if k, err := s.PutBatch(ctx, leased, blocks); err != nil || k != nLease {
		t.Fatalf("put: %d %v", k, err)
	}
	base := stats(t, c)

	child := clientProc(t, socketOf(dir), "hold", bs, 20, nRes,
		map[string]string{envSeed2: "10", envM: strconv.Itoa(nLease)}, "READY")
	held := stats(t, c)
	h0, b0 := held.Tiers[0], base.Tiers[0]
	if h0.Reserved != b0.Reserved+nRes || h0.Leased != b0.Leased+nLease ||
		h0.UsedBytes != b0.UsedBytes+nRes*bs || held.Sessions != base.Sessions+1 {
		t.Fatalf("while held: %+v sessions %d; before %+v sessions %d", h0, held.Sessions, b0, base.Sessions)
	}

	t0 := time.Now()
	if err := child.signal(syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("child exited cleanly after SIGKILL?")
	}
	killed := time.Since(t0)
	st, took, ok := waitStats(t, c, 2*time.Second, func(st *client.Stats) bool {
		x := st.Tiers[0]
		return x.Reserved == b0.Reserved && x.Leased == b0.Leased && x.UsedBytes == b0.UsedBytes && st.Sessions == base.Sessions
	})
	if !ok {
		t.Fatalf("not freed within 2s of the kill: %+v sessions %d; before %+v sessions %d", st.Tiers[0], st.Sessions, b0, base.Sessions)
	}
	t.Logf("kill -9 → slots freed in %v (reaped after %v)", killed+took, killed)
	if st.SessionsBad != base.SessionsBad {
		t.Errorf("a dead client counted as hostile: %d → %d", base.SessionsBad, st.SessionsBad)
	}

	// The child's uncommitted blocks never became visible and can be put
	// now; the blocks it leased are intact.
	if r, err := s.Lookup(ctx, chain(20, nRes)); err != nil || r.Hits != 0 {
		t.Fatalf("dead child's reservations visible: %+v %v", r, err)
	}
	if ok, err := s.Put(ctx, chain(20, 1)[0], payload(chain(20, 1)[0], bs)); err != nil || !ok {
		t.Fatalf("put over a dead reservation: %v %v", ok, err)
	}
	got := make([]byte, bs)
	for i, h := range leased {
		if err := s.Get(ctx, h, got); err != nil || !bytes.Equal(got, blocks[i]) {
			t.Fatalf("leased block %d after the child died: err %v", i, err)
		}
	}
	c.Close()
	if err := d.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
}

// TestProcessDaemonKilled: the daemon dies (SIGKILL) under a busy session;
// calls fail with ErrDisconnected, the old connection's reservations are void
// and its leases stay readable, and once a new daemon serves the same socket
// and state dir the SAME session works again.
func TestProcessDaemonKilled(t *testing.T) {
	t.Parallel()
	dir := tmpDir(t)
	d := daemonProc(t, dir, nil)
	const bs = 256 << 10
	c := dial(t, socketOf(dir))
	s := open(t, c, testNS("itest", bs))
	nsID := s.NamespaceID()
	ctx := context.Background()
	hs := chain(30, 2)
	for _, h := range hs {
		if ok, err := s.Put(ctx, h, payload(h, bs)); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	lease, err := s.Acquire(ctx, hs[0])
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Reserve(ctx, chain(31, 1)[0])
	if err != nil || res == nil {
		t.Fatal(res, err)
	}

	// Busy workers: every call either succeeds or fails with ErrDisconnected.
	var stop atomic.Bool
	var okCalls, discCalls atomic.Int64
	var badMu sync.Mutex
	var bad []error
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for !stop.Load() {
				var err error
				switch g {
				case 0:
					err = s.Nop(ctx)
				case 1:
					_, err = s.Lookup(ctx, hs)
				case 2:
					var l *client.Lease
					if l, err = s.Acquire(ctx, hs[1]); err == nil {
						l.Release()
					} else if errors.Is(err, client.ErrNotFound) {
						err = nil // gone after the restart: memory tier
					}
				}
				switch {
				case err == nil:
					okCalls.Add(1)
				case errors.Is(err, client.ErrDisconnected):
					discCalls.Add(1)
					time.Sleep(time.Millisecond)
				default:
					badMu.Lock()
					bad = append(bad, err)
					badMu.Unlock()
				}
			}
		}(g)
	}
	time.Sleep(100 * time.Millisecond)
	before := okCalls.Load()
	if err := d.signal(syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("daemon exited cleanly after SIGKILL?")
	}
	// The next call fails with ErrDisconnected (in flight or at reconnect).
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := s.Nop(ctx)
		if err != nil {
			if !errors.Is(err, client.ErrDisconnected) {
				t.Fatalf("call after daemon death: %v, want ErrDisconnected", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("calls still succeed 2s after the daemon died")
		}
	}
	if err := res.Commit(ctx); !errors.Is(err, client.ErrDisconnected) {
		t.Fatalf("commit on the dead connection: %v, want ErrDisconnected", err)
	}
	if !bytes.Equal(lease.Bytes(), payload(hs[0], bs)) {
		t.Fatal("lease of the dead connection no longer readable")
	}
	lease.Release() // void; must not fault

	d2 := daemonProc(t, dir, nil)
	deadline = time.Now().Add(5 * time.Second)
	for {
		err := s.Nop(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, client.ErrDisconnected) || time.Now().After(deadline) {
			t.Fatalf("reconnect: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	mid := okCalls.Load()
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("calls failed with errors other than ErrDisconnected: %v", bad)
	}
	t.Logf("calls: %d ok before the kill, %d ok total, %d ErrDisconnected", before, okCalls.Load(), discCalls.Load())
	if okCalls.Load() <= mid {
		t.Fatal("no call succeeded after the reconnect")
	}
	if s.NamespaceID() != nsID {
		t.Fatalf("namespace id %d after restart, was %d", s.NamespaceID(), nsID)
	}
	if r, err := s.Lookup(ctx, hs); err != nil || r.Hits != 0 {
		t.Fatalf("host tier survived a SIGKILL? %+v %v", r, err)
	}
	roundTrip(t, s, 32)
	st := stats(t, c)
	if st.Tiers[0].Reserved != 0 || st.Tiers[0].Leased != 0 || st.Sessions != 1 {
		t.Fatalf("after reconnect: %+v sessions %d", st.Tiers[0], st.Sessions)
	}
	c.Close()
	if err := d2.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
}

// TestProcessGracefulStop: SIGTERM stops a daemon with a session of this
// process, a session of another (live) process and a peer stuck before its
// Hello: it exits 0, promptly, removes its socket, and clients see
// ErrDisconnected.
func TestProcessGracefulStop(t *testing.T) {
	t.Parallel()
	dir := tmpDir(t)
	d := daemonProc(t, dir, nil)
	const bs = 64 << 10
	c := dial(t, socketOf(dir))
	s := open(t, c, testNS("itest", bs))
	ctx := context.Background()
	h := chain(40, 1)[0]
	if _, err := s.Put(ctx, h, payload(h, bs)); err != nil {
		t.Fatal(err)
	}
	lease, err := s.Acquire(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	other := clientProc(t, socketOf(dir), "hold", bs, 41, 2, map[string]string{envSeed2: "40", envM: "1"}, "READY")
	silent, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socketOf(dir), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	t0 := time.Now()
	if err := d.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v, want status 0", err)
	}
	t.Logf("graceful stop took %v", time.Since(t0))
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("graceful stop took %v", took)
	}
	if _, err := os.Stat(socketOf(dir)); !os.IsNotExist(err) {
		t.Errorf("socket still there after stop: %v", err)
	}
	if err := s.Nop(ctx); !errors.Is(err, client.ErrDisconnected) {
		t.Fatalf("call after stop: %v, want ErrDisconnected", err)
	}
	if !bytes.Equal(lease.Bytes(), payload(h, bs)) {
		t.Fatal("lease unreadable after the daemon stopped")
	}
	select {
	case <-other.done:
		t.Fatal("the other client process died with the daemon")
	default:
	}
}
