package itest

// Evidence suite (issue: evidence, point 1): client processes killed with
// SIGKILL in the middle of a Put and of a Get under a 16-process load, the
// daemon killed with SIGKILL under load with every later read checked byte
// for byte, and a hostile peer that attacks the shared arena's memfd.
//
// Every payload is payload(h): a pure function of the block hash, so every
// successful read is compared with the exact bytes any writer of h put.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// Client role "load" (see clientRole).
const (
	envEvStop  = "KVTIER_ITEST_STOP"  // load: stop (print LOAD, exit 0) once this file exists
	envEvStall = "KVTIER_ITEST_STALL" // load: "put" or "get": stall mid-op after evStallAt ops, until killed
)

// evStallAt is how many load ops a stalling child runs before it stalls.
const evStallAt = 200

// loadRole runs mixed put/get/lookup/delete on the child's own chain
// (seed, n blocks) and gets/lookups of a shared chain (seed2, m blocks)
// that the parent put, checking every answer against what it must be: the
// host tier is sized so nothing is evicted, so any miss, unexpected hit or
// differing byte is an error. It stops when the stop file appears and
// prints "LOAD ops puts gets lookups deletes".
//
// With a stall set it runs evStallAt ops, then either reserves two blocks
// and writes them (a Put between its copy and its commit: "MIDPUT") or
// acquires two shared blocks (a Get between acquire and release: "MIDGET"),
// and sleeps until the parent kills it.
func loadRole(ctx context.Context, s *client.Session, bs int, seed uint64, n int, seed2 uint64, m int, fail func(string, ...any) int) int {
	own, shared := chain(seed, n), chain(seed2, m)
	stopFile, stall := os.Getenv(envEvStop), os.Getenv(envEvStall)
	orphan := time.Now().Add(2 * time.Minute) // a parent that died never creates the stop file
	rng := mrand.New(mrand.NewPCG(seed, 7))
	want, got := make([]byte, bs), make([]byte, bs)
	stored := make([]bool, n)
	var ops, puts, gets, lookups, dels int
	fmt.Println("READY")
	for i := 0; ; i++ {
		if i%8 == 0 {
			if _, err := os.Stat(stopFile); err == nil {
				break
			}
			if time.Now().After(orphan) {
				return fail("no stop file after 2m")
			}
		}
		if stall != "" && i == evStallAt {
			switch stall {
			case "put":
				hs := chain(seed+1<<32, 2)
				rs, err := s.ReserveBatch(ctx, hs)
				if err != nil || rs[0] == nil || rs[1] == nil {
					return fail("stall reserve: %v", err)
				}
				for k, r := range rs {
					fillPayload(r.Bytes(), hs[k])
				}
				fmt.Println("MIDPUT")
			case "get":
				ls, err := s.AcquireBatch(ctx, shared[:2])
				if err != nil || ls[0] == nil || ls[1] == nil {
					return fail("stall acquire: %v", err)
				}
				fmt.Println("MIDGET")
			default:
				return fail("unknown stall %q", stall)
			}
			time.Sleep(time.Hour) // until the parent kills us
		}
		ops++
		switch r := rng.IntN(10); {
		case r < 3: // put an own block
			j := rng.IntN(n)
			fillPayload(want, own[j])
			ok, err := s.Put(ctx, own[j], want)
			if err != nil {
				return fail("put: %v", err)
			}
			if ok == stored[j] {
				return fail("put %d: stored=%v, cached before=%v", j, ok, stored[j])
			}
			stored[j] = true
			puts++
		case r < 6: // get an own or a shared block
			h, present := shared[rng.IntN(m)], true
			if rng.IntN(2) == 0 {
				j := rng.IntN(n)
				h, present = own[j], stored[j]
			}
			err := s.Get(ctx, h, got)
			switch {
			case !present && errors.Is(err, client.ErrNotFound):
			case !present:
				return fail("get of an absent block: %v", err)
			case err != nil:
				return fail("get: %v", err)
			default:
				fillPayload(want, h)
				if !bytes.Equal(got, want) {
					return fail("get %s: bytes differ", h)
				}
			}
			gets++
		case r < 8: // lookup of the shared chain and of the own chain
			lr, err := s.Lookup(ctx, shared)
			if err != nil || lr.Hits != m {
				return fail("lookup shared: %+v %v, want %d hits", lr, err, m)
			}
			lead := 0
			for lead < n && stored[lead] {
				lead++
			}
			if lr, err = s.Lookup(ctx, own); err != nil || lr.Hits != lead {
				return fail("lookup own: %d hits %v, want %d", lr.Hits, err, lead)
			}
			lookups++
		default: // delete an own block
			j := rng.IntN(n)
			ok, err := s.Delete(ctx, own[j])
			if err != nil || ok != stored[j] {
				return fail("delete %d: present=%v err=%v, want present=%v", j, ok, err, stored[j])
			}
			stored[j] = false
			dels++
		}
	}
	fmt.Printf("LOAD %d %d %d %d %d\n", ops, puts, gets, lookups, dels)
	return 0
}

// TestEvidenceClientKills: 16 client processes run a mixed, self-checking
// load; one is killed with SIGKILL while it holds reservations (mid-Put)
// and one while it holds leases (mid-Get). The other 14 finish without an
// error, the killed Put's blocks never become visible, and once the load's
// blocks are deleted the host tier's reserved, leased, used bytes and
// blocks are exactly what they were before the load.
func TestEvidenceClientKills(t *testing.T) {
	t.Parallel()
	dir := tmpDir(t)
	d := daemonProc(t, dir, map[string]string{envCapacity: "64MiB"})
	sock := socketOf(dir)
	const (
		procs  = 16
		bs     = 64 << 10
		n      = 16   // own blocks per child: 16 × 16 × 64 KiB = 16 MiB at most
		m      = 8    // shared blocks
		shSeed = 7000 // shared chain
		seed0  = 7100 // child i's chain is seed0+i
	)
	c := dial(t, sock)
	s := open(t, c, testNS("itest", bs))
	ctx := context.Background()
	shared := chain(shSeed, m)
	blocks := make([][]byte, m)
	for i, h := range shared {
		blocks[i] = payload(h, bs)
	}
	if k, err := s.PutBatch(ctx, shared, blocks); err != nil || k != m {
		t.Fatalf("put shared: %d %v", k, err)
	}
	base := stats(t, c)
	b0 := base.Tiers[0]

	stop := filepath.Join(dir, "stop")
	t0 := time.Now()
	kids := make([]*proc, procs)
	for i := range kids {
		env := map[string]string{envSeed2: strconv.Itoa(shSeed), envM: strconv.Itoa(m), envEvStop: stop}
		switch i {
		case 0:
			env[envEvStall] = "put"
		case 1:
			env[envEvStall] = "get"
		}
		kids[i] = clientProc(t, sock, "load", bs, uint64(seed0+i), n, env, "")
		kids[i].name = fmt.Sprintf("load-%d", i)
	}
	for _, k := range kids {
		k.expect("READY", 60*time.Second)
	}
	t.Logf("16 client processes ready after %v", time.Since(t0).Round(time.Millisecond))
	kids[0].expect("MIDPUT", 30*time.Second)
	kids[1].expect("MIDGET", 30*time.Second)
	held := stats(t, c)
	if h := held.Tiers[0]; h.Reserved < 2 || h.Leased < 2 || held.Sessions != base.Sessions+procs {
		t.Fatalf("while stalled: reserved %d leased %d sessions %d, want ≥2, ≥2, %d", h.Reserved, h.Leased, held.Sessions, base.Sessions+procs)
	}
	for _, k := range kids[:2] {
		if err := k.signal(syscall.SIGKILL, 10*time.Second); err == nil {
			t.Fatalf("%s exited cleanly after SIGKILL?", k.name)
		}
	}
	killedAt := time.Now()
	// The others keep going across the kills; make sure they do ops after.
	before := stats(t, c).Ops
	time.Sleep(500 * time.Millisecond)
	after := stats(t, c).Ops
	if sumOps(after) <= sumOps(before) {
		t.Fatal("no ops after the kills")
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var total [5]int
	for _, k := range kids[2:] {
		line := k.expect("LOAD", 30*time.Second)
		var v [5]int
		if _, err := fmt.Sscanf(line, "LOAD %d %d %d %d %d", &v[0], &v[1], &v[2], &v[3], &v[4]); err != nil {
			t.Fatalf("%s: %q: %v", k.name, line, err)
		}
		for i := range v {
			total[i] += v[i]
		}
		if err := k.wait(10 * time.Second); err != nil {
			t.Fatalf("%s exited with %v", k.name, err)
		}
	}
	el := time.Since(t0)
	t.Logf("14 surviving processes: %d ops (%d put, %d get, %d lookup×2, %d delete) in %v (%.0f ops/s), 0 errors; load ran %v past the kills",
		total[0], total[1], total[2], total[3], total[4], el.Round(time.Millisecond), float64(total[0])/el.Seconds(), time.Since(killedAt).Round(time.Millisecond))

	// The dead Put's reservations never became blocks.
	if lr, err := s.Lookup(ctx, chain(seed0+1<<32, 2)); err != nil || lr.Hits != 0 {
		t.Fatalf("killed Put's reservations visible: %+v %v", lr, err)
	}
	// The leased (by the dead Get) shared blocks are intact.
	got := make([][]byte, m)
	for i := range got {
		got[i] = make([]byte, bs)
	}
	if found, err := s.GetBatch(ctx, shared, got); err != nil {
		t.Fatal(err)
	} else {
		for i := range found {
			if !found[i] || !bytes.Equal(got[i], blocks[i]) {
				t.Fatalf("shared block %d after the load: found=%v, bytes differ", i, found[i])
			}
		}
	}
	deleted := 0
	for i := range procs {
		k, err := s.DeleteBatch(ctx, chain(uint64(seed0+i), n))
		if err != nil {
			t.Fatal(err)
		}
		deleted += k
	}
	st, took, ok := waitStats(t, c, 5*time.Second, func(st *client.Stats) bool {
		x := st.Tiers[0]
		return x.Reserved == b0.Reserved && x.Leased == b0.Leased && x.UsedBytes == b0.UsedBytes &&
			x.Blocks == b0.Blocks && st.Sessions == base.Sessions
	})
	x := st.Tiers[0]
	if !ok {
		t.Fatalf("after the load (%d blocks deleted): reserved %d leased %d used %d blocks %d sessions %d; before: %d %d %d %d %d",
			deleted, x.Reserved, x.Leased, x.UsedBytes, x.Blocks, st.Sessions, b0.Reserved, b0.Leased, b0.UsedBytes, b0.Blocks, base.Sessions)
	}
	t.Logf("after deleting the load's %d blocks: reserved %d leased %d used %d B blocks %d = pre-load (settled in %v); evictions %d",
		deleted, x.Reserved, x.Leased, x.UsedBytes, x.Blocks, took, x.Evictions-b0.Evictions)
	if st.SessionsBad != base.SessionsBad {
		t.Errorf("killed clients counted as hostile: %d → %d", base.SessionsBad, st.SessionsBad)
	}
	if x.Evictions != b0.Evictions {
		t.Errorf("the load evicted %d blocks; the tier is sized to hold it all", x.Evictions-b0.Evictions)
	}
	roundTrip(t, s, 7999)
	c.Close()
	if err := d.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
}

func sumOps(m map[string]uint64) (n uint64) {
	for _, v := range m {
		n += v
	}
	return n
}

// TestEvidenceDaemonKillUnderLoad: 4 sessions (one goroutine each) put,
// get and look up checksummed blocks; the daemon (NVMe tier on) is killed
// with SIGKILL mid-load. Every call either succeeds or fails with
// ErrDisconnected; each worker sees the disconnect; once a new daemon
// serves the same socket and state dir the same sessions reconnect. Every
// read before, during and after is byte-exact; every block the daemon
// flushed to NVMe before the kill, and every block put after the restart,
// is read back after the load.
func TestEvidenceDaemonKillUnderLoad(t *testing.T) {
	t.Parallel()
	dir := tmpDir(t)
	env := map[string]string{envCapacity: "64MiB", envNVMe: "256MiB"}
	d := daemonProc(t, dir, env)
	sock := socketOf(dir)
	const (
		workers = 4
		bs      = 256 << 10
		perW    = 32 // 4 × 32 × 256 KiB = 32 MiB: no eviction from the host tier
	)
	c := dial(t, sock)
	ctx := context.Background()

	// state of each block: 0 never stored, 1 stored before the kill,
	// 2 flushed to NVMe before the kill, 3 stored after the restart.
	var mu sync.Mutex
	state := map[client.Hash]int{}
	var phase atomic.Int32 // 0 before the kill, 1 killed, 2 restarted
	var ok, disc, notFound, verified [workers]atomic.Int64
	var stopped atomic.Bool
	var badMu sync.Mutex
	var bad []error
	addBad := func(err error) {
		badMu.Lock()
		bad = append(bad, err)
		badMu.Unlock()
	}
	sessions := make([]*client.Session, workers)
	for g := range sessions {
		sessions[g] = open(t, c, testNS("itest", bs))
	}
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := sessions[g]
			hs := chain(uint64(8000+g), perW)
			rng := mrand.New(mrand.NewPCG(uint64(g), 9))
			buf, want := make([]byte, bs), make([]byte, bs)
			next := 0
			for !stopped.Load() {
				var err error
				ph := phase.Load()
				switch r := rng.IntN(4); {
				case r == 0 && next < perW: // put a fresh block
					h := hs[next]
					next++
					fillPayload(buf, h)
					var stored bool
					if stored, err = s.Put(ctx, h, buf); err == nil {
						if !stored {
							addBad(fmt.Errorf("worker %d: fresh block not stored", g))
						}
						mu.Lock()
						if state[h] = 1; ph == 2 {
							state[h] = 3
						}
						mu.Unlock()
					}
				case r <= 1 && next > 0: // lookup
					_, err = s.Lookup(ctx, hs[:next])
				default: // get a block put earlier
					if next == 0 {
						continue
					}
					h := hs[rng.IntN(next)]
					mu.Lock()
					st := state[h]
					mu.Unlock()
					if err = s.Get(ctx, h, buf); err == nil {
						fillPayload(want, h)
						if !bytes.Equal(buf, want) {
							addBad(fmt.Errorf("worker %d: get %s: bytes differ", g, h))
						}
						verified[g].Add(1)
					} else if errors.Is(err, client.ErrNotFound) {
						// Only a block the kill lost may be missing (or
						// one whose put failed at the kill: state 0).
						if st >= 2 || (st == 1 && ph == 0) {
							addBad(fmt.Errorf("worker %d: block in state %d missing in phase %d", g, st, ph))
						}
						notFound[g].Add(1)
						err = nil
						continue
					}
				}
				switch {
				case err == nil:
					ok[g].Add(1)
				case errors.Is(err, client.ErrDisconnected):
					disc[g].Add(1)
					time.Sleep(time.Millisecond)
				default:
					addBad(fmt.Errorf("worker %d: %w", g, err))
				}
			}
		}()
	}
	defer func() { stopped.Store(true); wg.Wait() }()

	waitN := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, within)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	sumOf := func(v *[workers]atomic.Int64) (n int64) {
		for i := range v {
			n += v[i].Load()
		}
		return n
	}
	waitN("half the blocks put", 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(state) >= workers*perW/2 })
	// Flush: every block stored before the request is written to NVMe.
	mu.Lock()
	var before []client.Hash
	for h := range state {
		before = append(before, h)
	}
	mu.Unlock()
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
	flushed, err := c.Flush(fctx)
	fcancel()
	if err != nil {
		t.Fatalf("flush: %v", err)
	}
	mu.Lock()
	for _, h := range before {
		state[h] = 2
	}
	mu.Unlock()
	okBeforeKill := sumOf(&ok)
	time.Sleep(200 * time.Millisecond) // load on after the flush
	phase.Store(1)
	if err := d.signal(syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("daemon exited cleanly after SIGKILL?")
	}
	killedAt := time.Now()
	waitN("every worker sees ErrDisconnected", 5*time.Second, func() bool {
		for g := range disc {
			if disc[g].Load() == 0 {
				return false
			}
		}
		return true
	})
	okAtKill := sumOf(&ok)
	d2 := daemonProc(t, dir, env)
	phase.Store(2)
	restartedAt := time.Now()
	var okAt [workers]int64
	for g := range ok {
		okAt[g] = ok[g].Load()
	}
	waitN("every worker reconnects", 10*time.Second, func() bool {
		for g := range ok {
			if ok[g].Load() <= okAt[g] {
				return false
			}
		}
		return true
	})
	reconnected := time.Since(restartedAt)
	time.Sleep(300 * time.Millisecond) // load on after the restart
	stopped.Store(true)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d bad outcomes, first: %v", len(bad), errors.Join(bad[:min(len(bad), 5)]...))
	}

	// Read everything back through a fresh session and the old ones.
	lost, survived := 0, 0
	got := make([]byte, bs)
	for h, st := range state {
		for _, s := range []*client.Session{sessions[0], open(t, c, testNS("itest", bs))} {
			err := s.Get(ctx, h, got)
			switch {
			case err == nil:
				if !bytes.Equal(got, payload(h, bs)) {
					t.Fatalf("block %s (state %d): bytes differ after the restart", h, st)
				}
			case errors.Is(err, client.ErrNotFound) && st == 1:
				lost++
				continue
			default:
				t.Fatalf("block %s (state %d) after the restart: %v", h, st, err)
			}
		}
		if st == 2 {
			survived++
		}
	}
	stAfter := stats(t, c)
	for _, ts := range stAfter.Tiers {
		if ts.ChecksumMisses != 0 {
			t.Errorf("tier %s: %d checksum misses", ts.Name, ts.ChecksumMisses)
		}
	}
	var dsum, nf, vs int64 = sumOf(&disc), sumOf(&notFound), sumOf(&verified)
	t.Logf("%d workers: %d ok calls before the flush, %d before the kill, %d total; %d ErrDisconnected; every worker reconnected %v after the restart (daemon down %v)",
		workers, okBeforeKill, okAtKill, sumOf(&ok), dsum, reconnected.Round(time.Millisecond), restartedAt.Sub(killedAt).Round(time.Millisecond))
	t.Logf("reads byte-exact under load: %d; misses of unflushed pre-kill blocks: %d", vs, nf)
	t.Logf("after the restart: %d blocks checked twice, byte-exact; %d flushed (flush wrote %d) all found; %d unflushed pre-kill blocks lost with the host tier (%d lost reads); wrong bytes: 0",
		len(state), survived, flushed, countState(state, 1), lost)
	c.Close()
	if err := d2.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
}

func countState(m map[client.Hash]int, v int) (n int) {
	for _, s := range m {
		if s == v {
			n++
		}
	}
	return n
}

// arenaPeer does a namespace handshake by hand and keeps both fds the
// daemon passes: the arena memfd and the session's ring memfd.
func arenaPeer(t *testing.T, socket string, ns shm.Namespace) (w shm.Welcome, arena, ring int, conn interface{ Close() error }) {
	t.Helper()
	c := rawDial(t, socket)
	send(t, c, helloMsg(ns, 0))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, fds, err := shm.RecvMsg(c, make([]byte, 64<<10), shm.WelcomeFDs)
	if err != nil {
		t.Fatalf("welcome: %v", err)
	}
	c.SetReadDeadline(time.Time{})
	typ, _, p, err := shm.DecodeMsg(raw)
	if err != nil || typ != shm.MsgWelcome || len(fds) != shm.WelcomeFDs {
		t.Fatalf("welcome: type %d fds %d err %v", typ, len(fds), err)
	}
	if w, err = shm.DecodeWelcome(p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return w, fds[0], fds[1], c
}

var evSink byte

// faultsAt reports whether reading b[i] faults (SIGBUS past the end of the
// file), recovering the fault.
func faultsAt(b []byte, i int) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if recover() != nil {
			faulted = true
		}
	}()
	evSink = b[i]
	return false
}

// TestEvidenceHostileArena: a peer holding the daemon's arena and ring
// memfds tries to resize them (ftruncate, fallocate, through a reopened
// /proc/self/fd path), to add F_SEAL_WRITE / F_SEAL_FUTURE_WRITE (which
// would stall or fault the daemon's writes), and to map and remap them
// beyond their size. Every resize and seal is refused; mappings past the
// end fault in the hostile process only; sizes and seals are unchanged;
// the hostile peer's own session still works; the daemon and a good
// session in another connection are unaffected.
func TestEvidenceHostileArena(t *testing.T) {
	t.Parallel()
	dir := tmpDir(t)
	d := daemonProc(t, dir, nil)
	sock := socketOf(dir)
	const bs = 64 << 10
	ns := testNS("itest", bs)
	c := dial(t, sock)
	good := open(t, c, ns)
	roundTrip(t, good, 9000)
	base := stats(t, c)

	w, arenaFD, ringFD, conn := arenaPeer(t, sock, ns)
	const seal = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	const sealFutureWrite = 0x0010 // F_SEAL_FUTURE_WRITE (Linux 5.1)
	tried := 0
	for _, f := range []struct {
		name string
		fd   int
		size int64
	}{{"arena", arenaFD, int64(w.ArenaSize)}, {"ring", ringFD, int64(w.RingSize)}} {
		refused := func(what string, err error) {
			t.Helper()
			tried++
			if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EBUSY) {
				t.Errorf("%s: %s: %v, want EPERM (sealed)", f.name, what, err)
			}
		}
		var st unix.Stat_t
		if err := unix.Fstat(f.fd, &st); err != nil || st.Size != f.size {
			t.Fatalf("%s: fstat size %d (%v), welcome says %d", f.name, st.Size, err, f.size)
		}
		seals, err := unix.FcntlInt(uintptr(f.fd), unix.F_GET_SEALS, 0)
		if err != nil || seals&seal != seal {
			t.Fatalf("%s: seals %#x (%v), want %#x", f.name, seals, err, seal)
		}
		refused("ftruncate(0)", unix.Ftruncate(f.fd, 0))
		refused("ftruncate(size/2)", unix.Ftruncate(f.fd, f.size/2))
		refused("ftruncate(size*2)", unix.Ftruncate(f.fd, f.size*2))
		refused("fallocate past the end", unix.Fallocate(f.fd, 0, f.size, 2<<20))
		_, err = unix.FcntlInt(uintptr(f.fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE)
		refused("F_ADD_SEALS F_SEAL_WRITE", err)
		_, err = unix.FcntlInt(uintptr(f.fd), unix.F_ADD_SEALS, sealFutureWrite)
		refused("F_ADD_SEALS F_SEAL_FUTURE_WRITE", err)
		if re, err := unix.Open("/proc/self/fd/"+strconv.Itoa(f.fd), unix.O_RDWR, 0); err != nil {
			t.Errorf("%s: reopen: %v", f.name, err)
		} else {
			refused("ftruncate through a reopened fd", unix.Ftruncate(re, 0))
			unix.Close(re)
		}
		// Mapping past the end: the kernel grants the address range, but
		// the pages past the end of the (unchangeable) file fault, in this
		// process only.
		const huge = 2 << 20
		span := int((f.size+huge-1)/huge*huge) + huge
		if mm, err := unix.Mmap(f.fd, 0, span, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
			tried++
			if !faultsAt(mm, int(f.size)) || !faultsAt(mm, span-1) {
				t.Errorf("%s: a mapping past the end is readable past the end", f.name)
			}
			if faultsAt(mm, int(f.size)-1) {
				t.Errorf("%s: the last byte in range faults", f.name)
			}
			// Grow that mapping further with mremap: same.
			if mm2, err := unix.Mremap(mm, 2*span, unix.MREMAP_MAYMOVE); err == nil {
				tried++
				if !faultsAt(mm2, 2*span-1) {
					t.Errorf("%s: a remapped range past the end is readable", f.name)
				}
				mm = mm2
			}
			unix.Munmap(mm)
		} else {
			tried++
			t.Logf("%s: mmap past the end refused: %v", f.name, err)
		}
		if mm, err := unix.Mmap(f.fd, f.size+huge, huge, unix.PROT_READ, unix.MAP_SHARED); err == nil {
			tried++
			if !faultsAt(mm, 0) {
				t.Errorf("%s: a mapping at an offset past the end is readable", f.name)
			}
			unix.Munmap(mm)
		}
		if err := unix.Fstat(f.fd, &st); err != nil || st.Size != f.size {
			t.Fatalf("%s: size %d after the attacks (%v), was %d", f.name, st.Size, err, f.size)
		}
		if s2, _ := unix.FcntlInt(uintptr(f.fd), unix.F_GET_SEALS, 0); s2 != seals {
			t.Fatalf("%s: seals %#x after the attacks, were %#x", f.name, s2, seals)
		}
	}
	t.Logf("%d resize/seal/map attempts on the arena (%d MiB) and ring (%d KiB) memfds: all refused or faulting in the peer only",
		tried, w.ArenaSize>>20, w.RingSize>>10)

	// The hostile peer's own session still answers (its ring is intact).
	dup, err := unix.Dup(ringFD)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := shm.MapRegion(dup, int64(w.RingSize), false) // owns dup
	if err != nil {
		t.Fatal(err)
	}
	ring, err := shm.NewRing(reg.Bytes(), w.Ring, false)
	if err != nil {
		t.Fatal(err)
	}
	rs := &rawSession{t: t, w: w, reg: reg, ring: ring, mem: reg.Bytes()}
	cq := rs.do(shm.SQE{Op: shm.OpNop})
	if cq[0].Status != shm.StatusOK {
		t.Fatalf("hostile peer's own nop: status %d", cq[0].Status)
	}
	// Punching a hole is not a resize: it succeeds and zeroes the pages,
	// which is what the peer can do anyway with a memset through its own
	// read-write mapping (the arena's bytes are as writable to every
	// allowed peer as they are to the daemon; see docs/reliability.md). The
	// daemon must shrug it off: it keeps no state of its own in the arena.
	if err := unix.Fallocate(arenaFD, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, int64(w.ArenaSize)); err != nil {
		t.Logf("punch hole in the arena: %v", err)
	} else {
		t.Logf("punch hole over the whole arena: allowed (zeroes it, like a memset through the peer's mapping)")
	}
	conn.Close()
	reg.Close()
	// The daemon, the good session and a new session are unaffected.
	roundTrip(t, good, 9001)
	c2 := dial(t, sock)
	roundTrip(t, open(t, c2, ns), 9002)
	st, _, ok := waitStats(t, c, 5*time.Second, func(st *client.Stats) bool { return st.Sessions == base.Sessions+1 })
	if !ok {
		t.Fatalf("sessions %d, want %d", st.Sessions, base.Sessions+1)
	}
	if st.SessionsBad != base.SessionsBad {
		t.Errorf("hostile sessions %d → %d: the peer only used the fds it was given", base.SessionsBad, st.SessionsBad)
	}
	if x := st.Tiers[0]; x.Reserved != 0 || x.Leased != 0 {
		t.Fatalf("after the hostile peer: %+v", x)
	}
	c2.Close()
	c.Close()
	if err := d.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
}
