package daemon

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/nvme"
)

// fakeClock is a registry clock the test moves on.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// waitSessions waits (at most 10 s) until d has want sessions open.
func waitSessions(t *testing.T, d *Daemon, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		d.mu.Lock()
		n := len(d.sessions) + d.opening
		d.mu.Unlock()
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions open after 10s, want %d", n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fillIdleRegistry starts a daemon on cfg whose registry holds limit
// namespaces and fills it with sessions that all close, then moves the
// registry's clock an hour on: every namespace is idle.
func fillIdleRegistry(t *testing.T, cfg Config, limit int) *running {
	t.Helper()
	clk := newFakeClock()
	r := startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), func(d *Daemon) {
		d.reg.limit, d.reg.now = limit, clk.Now
	})
	for i := range limit {
		p, code := rawOpen(t, cfg.Socket, rawNS(fmt.Sprintf("filler-%d", i), 4096))
		if p == nil {
			t.Fatalf("session %d refused: code %d", i, code)
		}
		p.conn.Close()
	}
	waitSessions(t, r.d, 0)
	clk.Advance(time.Hour)
	return r
}

// TestRegistryFullReclaimsClosedSessions: a registry filled by sessions
// that have all closed, holding no block, long unused, admits a new model.
// It used to refuse every new model for good ("namespace registry full")
// until an operator wiped the state dir.
func TestRegistryFullReclaimsClosedSessions(t *testing.T) {
	const limit = 4
	cfg := testConfig(t)
	fillIdleRegistry(t, cfg, limit)
	if p, code := rawOpen(t, cfg.Socket, rawNS("newcomer", 4096)); p == nil {
		t.Fatalf("new model refused (code %d) with a full registry of %d idle namespaces (no session, no block, unused for an hour)", code, limit)
	}
}

// TestReclaimDeletesLateBlocks: a block that reached a tier under an idle
// namespace's id after the reclaim's idle check (a move down the tiers the
// check missed) kept the reclaimed id: never served again (ids are not
// reused), out of evict --all's reach (it walks registered ids), holding
// its space until its tier evicted it. A reclaim now deletes what the
// tiers hold under the ids it took out.
func TestReclaimDeletesLateBlocks(t *testing.T) {
	const limit = 4
	cfg := testConfig(t)
	r := fillIdleRegistry(t, cfg, limit)
	// After the check, a block arrives under each id it found idle.
	var late []tiers.Key
	r.d.reg.wmu.Lock()
	inUse := r.d.reg.inUse
	r.d.reg.inUse = func(ids map[uint32]struct{}) {
		inUse(ids)
		for id := range ids {
			k := tiers.Key{NS: id, Hash: shm.Hash{Hi: uint64(id), Lo: 1}}
			h, err := r.d.chain.Reserve(k, 4096)
			if err != nil {
				t.Errorf("reserve a late block of namespace %d: %v", id, err)
				continue
			}
			if err := r.d.host.Commit(h); err != nil {
				t.Errorf("commit a late block of namespace %d: %v", id, err)
				continue
			}
			late = append(late, k)
		}
	}
	r.d.reg.wmu.Unlock()
	if p, code := rawOpen(t, cfg.Socket, rawNS("newcomer", 4096)); p == nil {
		t.Fatalf("new model refused (code %d) with a full registry of idle namespaces", code)
	}
	if len(late) != limit {
		t.Fatalf("%d late blocks written, want one per idle namespace (%d)", len(late), limit)
	}
	for _, k := range late {
		if r.d.host.Contains(k) {
			t.Errorf("host tier still holds a block of reclaimed namespace %d after the reclaim", k.NS)
		}
	}
}

// TestNamespaceReclaimOnlyIdle: a full registry admits a new namespace by
// reclaiming those that are idle, and only those: a namespace with a
// session, a block in any tier (host, a quarantined reservation, NVMe,
// parked in the host tier or NVMe, a GPU arena), or registered within the
// grace period, keeps its id.
func TestNamespaceReclaimOnlyIdle(t *testing.T) {
	if cudaipc.Emulated {
		t.Setenv(cudaipc.EnvEmulatedGPUs, "1:64MiB")
	}
	cfg := testConfig(t)
	cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 64*MiB
	cfg.GPU.Enabled, cfg.GPU.ArenaBytes, cfg.GPU.SlabBytes = cudaipc.Emulated, 16*MiB, MiB
	cfg.Metrics.Listen = "127.0.0.1:0"
	clk := newFakeClock()
	var logs syncBuffer
	const bs = 4096
	type state int
	const (
		closed      state = iota // a session opened and closed, no block
		evicted                  // its blocks put, then evicted (kvtierctl evict)
		open                     // a session still open
		hostBlock                // a block in the host tier, session closed
		quarantined              // a reservation of a closed session, held for its live process
		nvmeBlock                // a block in NVMe only
		parkedHost               // a parked block in the host tier
		parkedNVMe               // a parked block in NVMe
		gpuBlock                 // a block in a GPU arena
		recent                   // registered within the grace period
	)
	type reclaimCase struct {
		name    string
		st      state
		reclaim bool
	}
	cases := []reclaimCase{
		{"closed session, no block", closed, true},
		{"blocks evicted", evicted, true},
		{"session open", open, false},
		{"host block", hostBlock, false},
		{"quarantined reservation", quarantined, false},
		{"nvme block", nvmeBlock, false},
		{"parked block in host", parkedHost, false},
		{"parked block in nvme", parkedNVMe, false},
		{"gpu block", gpuBlock, false},
		{"used within the grace period", recent, false},
	}
	if !cudaipc.Emulated {
		cases = slices.DeleteFunc(cases, func(c reclaimCase) bool { return c.st == gpuBlock })
	}
	r := startDaemonWith(t, cfg, slog.New(slog.NewTextHandler(&logs, nil)), func(d *Daemon) {
		d.reg.limit, d.reg.now = len(cases), clk.Now
	})
	d := r.d
	if cudaipc.Emulated && d.gpus == nil {
		t.Fatal("GPU tier off with an emulated GPU")
	}
	if v := scrape(t, d.MetricsAddr()).must(t, "kvtier_namespaces_reclaimed_total"); v != 0 {
		t.Fatalf("kvtier_namespaces_reclaimed_total = %v before any reclaim", v)
	}
	ids := make([]uint32, len(cases))
	specs := make([]NamespaceSpec, len(cases))
	h := shm.Hash{Hi: 7, Lo: 9}
	put := func(p *rawPeer, commit bool) {
		t.Helper()
		cq := p.do(shm.SQE{Op: shm.OpReserve, Hash: h, UserData: 1})
		if cq[0].Status != shm.StatusOK {
			t.Fatalf("reserve: status %d", cq[0].Status)
		}
		if commit {
			if cq = p.do(shm.SQE{Op: shm.OpCommit, Token: cq[0].Value, UserData: 2}); cq[0].Status != shm.StatusOK {
				t.Fatalf("commit: status %d", cq[0].Status)
			}
		}
	}
	for i, c := range cases {
		specs[i] = rawNS(fmt.Sprintf("reclaim-%d", i), bs)
		if c.st == recent {
			continue // after the clock moves on
		}
		switch c.st {
		case closed, evicted, open, hostBlock, quarantined:
			p, code := rawOpen(t, cfg.Socket, specs[i])
			if p == nil {
				t.Fatalf("%s: session refused: code %d", c.name, code)
			}
			ids[i] = p.w.NamespaceID
			switch c.st {
			case evicted, hostBlock:
				put(p, true)
			case quarantined:
				put(p, false)
			}
			if c.st != open {
				p.conn.Close()
			}
		default:
			id, err := d.reg.Register(specs[i])
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = id
		}
	}
	waitSessions(t, d, 1) // the open one
	if q := d.quar.blocks.Load(); q != 1 {
		t.Fatalf("%d reservations quarantined, want 1", q)
	}
	for i, c := range cases {
		k := tiers.Key{NS: ids[i], Hash: h}
		switch c.st {
		case evicted:
			if n := d.deleteNS(ids[i]); n != 1 {
				t.Fatalf("%s: evicted %d blocks, want 1", c.name, n)
			}
		case nvmeBlock, parkedNVMe:
			if c.st == parkedNVMe {
				k.NS |= tiers.ParkedNS
			}
			if err := d.nvme.Put(nvme.Key{NS: k.NS, Hash: h}, make([]byte, bs)); err != nil {
				t.Fatal(err)
			}
		case parkedHost:
			k.NS |= tiers.ParkedNS
			hd, err := d.host.Reserve(k, bs)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.host.Commit(hd); err != nil {
				t.Fatal(err)
			}
		case gpuBlock:
			hd, err := d.gpus.Reserve(k, bs, 0)
			if err != nil {
				t.Fatal(err)
			}
			g := d.gpus.GPUOf(hd)
			if g == nil {
				t.Fatalf("%s: reserved in the host tier, want GPU 0", c.name)
			}
			if err := g.Slots.Commit(hd); err != nil {
				t.Fatal(err)
			}
			d.gpus.Committed(g)
		}
	}
	clk.Advance(reclaimGrace + time.Minute)
	for i, c := range cases {
		if c.st == recent {
			id, err := d.reg.Register(specs[i])
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = id
		}
	}

	newcomer := rawNS("reclaim-newcomer", bs)
	p, code := rawOpen(t, cfg.Socket, newcomer)
	if p == nil {
		t.Fatalf("new namespace refused (code %d) by a full registry with idle namespaces", code)
	}
	newID := p.w.NamespaceID
	all := d.reg.All()
	reclaimed := 0
	for i, c := range cases {
		_, kept := all[ids[i]]
		if kept == c.reclaim {
			t.Errorf("%s (id %d): reclaimed %v, want %v", c.name, ids[i], !kept, c.reclaim)
		}
		if c.reclaim {
			reclaimed++
		}
		if newID <= ids[i] {
			t.Errorf("new namespace got id %d, not above %s's %d", newID, c.name, ids[i])
		}
	}
	if all[newID] != newcomer {
		t.Errorf("new namespace's id %d names %+v", newID, all[newID])
	}
	if got := d.reg.Reclaimed(); got != uint64(reclaimed) {
		t.Errorf("Reclaimed() = %d, want %d", got, reclaimed)
	}
	if v := scrape(t, d.MetricsAddr()).must(t, "kvtier_namespaces_reclaimed_total"); v != float64(reclaimed) {
		t.Errorf("kvtier_namespaces_reclaimed_total = %v, want %d", v, reclaimed)
	}
	if want := fmt.Sprintf("reclaimed=%d", reclaimed); !strings.Contains(logs.String(), want) {
		t.Errorf("no Info line with %s; log:\n%s", want, logs.String())
	}
	// A reclaimed spec coming back gets a new id, above every earlier one.
	again, err := d.reg.Register(specs[0])
	if err != nil || again <= newID {
		t.Errorf("reclaimed spec registered again: id %d, %v; want a new id above %d", again, err, newID)
	}
}

// reclaimRegistry opens a registry in dir that holds at most limit
// namespaces, on clk, whose inUse check keeps the ids in busy and counts
// its calls, and fills it with specs full-0 .. full-(limit-1) (ids 1 ..
// limit).
func reclaimRegistry(t *testing.T, dir string, limit int, clk *fakeClock, busy map[uint32]bool, calls *int) *Registry {
	t.Helper()
	r := reopen(t, dir)
	r.limit, r.now = limit, clk.Now
	r.setReclaim(func(ids map[uint32]struct{}) {
		*calls++
		for id := range ids {
			if busy[id] {
				delete(ids, id)
			}
		}
	}, nil, slog.New(slog.DiscardHandler))
	for i := range limit {
		if id, err := r.Register(testSpec(fmt.Sprintf("full-%d", i), 0)); err != nil || id != uint32(i+1) {
			t.Fatalf("fill: id %d, %v; want %d", id, err, i+1)
		}
	}
	return r
}

// TestRegistryReclaim: what a full registry reclaims, when, and what it
// leaves on disk.
func TestRegistryReclaim(t *testing.T) {
	const limit = 4
	newSpec := testSpec("newcomer", 0)
	tests := []struct {
		name string
		busy map[uint32]bool // ids the daemon reports in use
		// touch: specs (by fill index) registered again just before the
		// new one, within the grace period.
		touch []int
		kept  []uint32 // ids left after the new spec is admitted; nil: refused
	}{
		{"all idle", nil, nil, []uint32{}},
		{"some in use", map[uint32]bool{2: true, 4: true}, nil, []uint32{2, 4}},
		{"some used within the grace period", nil, []int{0, 2}, []uint32{1, 3}},
		{"in use or recently used", map[uint32]bool{1: true}, []int{1}, []uint32{1, 2}},
		{"none idle", map[uint32]bool{1: true, 2: true}, []int{2, 3}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			clk := newFakeClock()
			calls := 0
			r := reclaimRegistry(t, dir, limit, clk, tt.busy, &calls)
			clk.Advance(reclaimGrace + time.Minute)
			for _, i := range tt.touch {
				if id, err := r.Register(testSpec(fmt.Sprintf("full-%d", i), 0)); err != nil || id != uint32(i+1) {
					t.Fatalf("touch full-%d: id %d, %v", i, id, err)
				}
			}
			clk.Advance(time.Minute)
			id, err := r.Register(newSpec)
			if calls != 1 {
				t.Errorf("inUse called %d times, want 1", calls)
			}
			if tt.kept == nil {
				if err == nil || !strings.Contains(err.Error(), "namespace registry full") {
					t.Fatalf("Register with nothing idle: id %d, err %v; want refused, registry full", id, err)
				}
				if n := len(r.All()); n != limit || r.Reclaimed() != 0 {
					t.Errorf("refused Register left %d namespaces, reclaimed %d; want %d, 0", n, r.Reclaimed(), limit)
				}
				return
			}
			if err != nil {
				t.Fatalf("Register of a new spec: %v", err)
			}
			if id != limit+1 {
				t.Errorf("new spec got id %d, want %d (ids are never reused)", id, limit+1)
			}
			want := map[uint32]NamespaceSpec{id: newSpec}
			for _, k := range tt.kept {
				want[k] = testSpec(fmt.Sprintf("full-%d", k-1), 0)
			}
			if got := r.All(); !maps.Equal(got, want) {
				t.Fatalf("after reclaim: %v, want ids %v and %d", slices.Sorted(maps.Keys(got)), tt.kept, id)
			}
			if got := r.Reclaimed(); got != uint64(limit-len(tt.kept)) {
				t.Errorf("Reclaimed() = %d, want %d", got, limit-len(tt.kept))
			}
			// An older kvtierd reads the snapshot alone: a valid
			// registry without the reclaimed ids, whose next_id is
			// above every id handed out.
			data, err := os.ReadFile(filepath.Join(dir, registryFile))
			if err != nil {
				t.Fatal(err)
			}
			doc, err := decodeRegistry(data)
			if err != nil {
				t.Fatalf("snapshot after reclaim: %v", err)
			}
			onDisk := map[uint32]NamespaceSpec{}
			for _, rec := range doc.Namespaces {
				onDisk[rec.ID] = rec.Spec
			}
			if !maps.Equal(onDisk, want) || doc.NextID <= id {
				t.Errorf("snapshot holds %v with next_id %d; want ids %v and %d, next_id above %d",
					slices.Sorted(maps.Keys(onDisk)), doc.NextID, tt.kept, id, id)
			}
			// The reclaim survives a restart; a reclaimed spec then
			// gets a new id, above every earlier one.
			r2 := reopen(t, dir)
			if got := r2.All(); !maps.Equal(got, want) {
				t.Fatalf("after reopen: %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
			}
			for i := range limit {
				spec := testSpec(fmt.Sprintf("full-%d", i), 0)
				if _, kept := want[uint32(i+1)]; kept {
					continue
				}
				again, err := r2.Register(spec)
				if err != nil || again <= id {
					t.Errorf("reclaimed full-%d registered again: id %d, %v; want a new id above %d", i, again, err, id)
				}
			}
		})
	}
}

// TestRegistryReclaimSpaced: a full registry with nothing idle walks the
// tiers at most once per reclaimEvery (a peer naming new namespaces must
// not make it walk them at will), then reclaims what became idle.
func TestRegistryReclaimSpaced(t *testing.T) {
	clk := newFakeClock()
	calls := 0
	busy := map[uint32]bool{1: true, 2: true, 3: true}
	r := reclaimRegistry(t, t.TempDir(), 3, clk, busy, &calls)
	clk.Advance(reclaimGrace)
	for i := range 5 {
		if id, err := r.Register(testSpec(fmt.Sprintf("new-%d", i), 0)); err == nil {
			t.Fatalf("Register with nothing idle admitted new-%d as %d", i, id)
		}
	}
	if calls != 1 {
		t.Fatalf("5 refused Registers within %s checked the tiers %d times, want 1", reclaimEvery, calls)
	}
	delete(busy, 2)
	clk.Advance(reclaimEvery)
	id, err := r.Register(testSpec("new-5", 0))
	if err != nil || calls != 2 {
		t.Fatalf("Register after %s with an idle namespace: id %d, %v, %d checks; want admitted, 2 checks", reclaimEvery, id, err, calls)
	}
	if _, ok := r.Lookup(2); ok {
		t.Error("idle id 2 not reclaimed")
	}
}

// TestRegistryReclaimConcurrent: Registers of known specs racing a reclaim
// either keep their id (a Register marks the namespace used, so the reclaim
// skips it) or wait for the reclaim and get a new one; never an id the
// reclaim took. Specs 0..kept-1 are registered again while the reclaim
// checks the tiers (after it chose its candidates), specs kept..touched-1
// once it has marked them reclaiming; every spec ends with one id, the
// registry's.
func TestRegistryReclaimConcurrent(t *testing.T) {
	const limit, kept, touched, fresh = 64, 8, 16, 8
	dir := t.TempDir()
	clk := newFakeClock()
	r := reopen(t, dir)
	r.limit, r.now = limit, clk.Now
	inReclaim, touchedA := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.setReclaim(func(ids map[uint32]struct{}) {
		once.Do(func() { close(inReclaim) })
		select { // the walk of the tiers: group A registers meanwhile
		case <-touchedA:
		case <-time.After(10 * time.Second):
			t.Error("group A did not register its specs within 10s")
		}
	}, nil, slog.New(slog.DiscardHandler))
	old := func(i int) NamespaceSpec { return testSpec(fmt.Sprintf("old-%d", i), 0) }
	for i := range limit {
		if _, err := r.Register(old(i)); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(reclaimGrace + time.Minute)

	var mu sync.Mutex
	got := map[NamespaceSpec]map[uint32]bool{}
	register := func(spec NamespaceSpec) bool {
		id, err := r.Register(spec)
		if err != nil {
			t.Error(err)
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if got[spec] == nil {
			got[spec] = map[uint32]bool{}
		}
		got[spec][id] = true
		return true
	}
	// taken reports whether the reclaim marked spec i's id or removed it.
	taken := func(i int) bool {
		r.mu.RLock()
		defer r.mu.RUnlock()
		u := r.used[uint32(i+1)]
		return u == nil || u.Load() == reclaiming
	}
	var wg, groupA sync.WaitGroup
	for w := range 2 { // group A: specs 0..kept-1
		groupA.Add(1)
		wg.Go(func() {
			<-inReclaim
			for i := range kept {
				if !register(old((i + w*3) % kept)) {
					break
				}
			}
			groupA.Done()
			for n := range 100 {
				if !register(old((n + w) % kept)) {
					return
				}
			}
		})
	}
	go func() { groupA.Wait(); close(touchedA) }()
	for w := range 2 { // group B: specs kept..touched-1, once taken
		wg.Go(func() {
			<-inReclaim
			for n := range 100 {
				i := kept + (n+w*3)%(touched-kept)
				for deadline := time.Now().Add(10 * time.Second); !taken(i); {
					if time.Now().After(deadline) {
						t.Errorf("old-%d not reclaimed after 10s", i)
						return
					}
					runtime.Gosched()
				}
				if !register(old(i)) {
					return
				}
			}
		})
	}
	for w := range fresh { // new specs: the first one in reclaims
		wg.Go(func() { register(testSpec(fmt.Sprintf("new-%d", w), 0)) })
	}
	wg.Wait()

	all := r.All()
	owner := map[uint32]NamespaceSpec{}
	for spec, ids := range got {
		if len(ids) != 1 {
			t.Errorf("%s got ids %v, want one", spec.ModelID, slices.Sorted(maps.Keys(ids)))
		}
		for id := range ids {
			if all[id] != spec {
				t.Errorf("%s was handed id %d, which the registry holds for %q", spec.ModelID, id, all[id].ModelID)
			}
			if prev, ok := owner[id]; ok && prev != spec {
				t.Errorf("id %d handed to %s and %s", id, prev.ModelID, spec.ModelID)
			}
			owner[id] = spec
		}
	}
	for i := range touched {
		id, ok := r.bySpecID(old(i))
		switch {
		case !ok:
			t.Errorf("old-%d not registered", i)
		case i < kept && id != uint32(i+1):
			t.Errorf("old-%d, registered during the reclaim's check, has id %d, want its own %d", i, id, i+1)
		case i >= kept && id <= limit:
			t.Errorf("old-%d, registered once marked reclaiming, has id %d, want a new one above %d", i, id, limit)
		}
	}
	if want := uint64(limit - kept); r.Reclaimed() != want {
		t.Errorf("reclaimed %d, want %d", r.Reclaimed(), want)
	}
	if got := reopen(t, dir).All(); !maps.Equal(got, all) {
		t.Errorf("after reopen the registry holds %d namespaces, had %d", len(got), len(all))
	}
}

// bySpecID is the id of spec, for tests.
func (r *Registry) bySpecID(spec NamespaceSpec) (uint32, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	id, ok := r.bySpec[spec]
	return id, ok
}
