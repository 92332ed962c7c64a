// Model-based randomized concurrency test of the tier chain: host tier +
// NVMe tier + mover + promotions + parked requests + policy, driven by
// several goroutines at once, every read checked against a model of what
// was committed and deleted.

package tiers

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
	"github.com/kvtier/kvtier/tiers/policy"
)

var (
	flagModelDur  = flag.Duration("chainmodel.dur", 0, "run each TestChainModel variant this long (default 1.5s)")
	flagModelSeed = flag.Uint64("chainmodel.seed", 0, "seed of TestChainModel (default: time-based, logged)")
)

// The model's clock orders the start and end of operations across
// goroutines: an operation that ended before another started has a
// smaller end tick than the other's start tick.
type modelClock struct{ n atomic.Int64 }

func (c *modelClock) tick() int64 { return c.n.Add(1) }

// span is one Delete or DeleteNS: [start, end] on the model clock.
type span struct{ start, end int64 }

// mgen is one generation of a key: the bytes one Reserve wrote.
type mgen struct {
	commitStart int64 // tick before Commit was called (0: never committed)
	commitEnd   int64 // tick after Commit returned
}

// chainModel is what the test knows: each key's generations and the
// deletes that completed.
type chainModel struct {
	clk    modelClock
	gen    atomic.Uint64
	mu     sync.Mutex
	gens   map[Key]map[uint64]*mgen
	dels   map[Key][]span
	nsDels map[uint32][]span
}

func newChainModel() *chainModel {
	return &chainModel{gens: map[Key]map[uint64]*mgen{}, dels: map[Key][]span{}, nsDels: map[uint32][]span{}}
}

func (m *chainModel) newGen(k Key) uint64 {
	g := m.gen.Add(1)
	m.mu.Lock()
	if m.gens[k] == nil {
		m.gens[k] = map[uint64]*mgen{}
	}
	m.gens[k][g] = &mgen{}
	m.mu.Unlock()
	return g
}

func (m *chainModel) committing(k Key, g uint64) {
	t := m.clk.tick()
	m.mu.Lock()
	m.gens[k][g].commitStart = t
	m.mu.Unlock()
}

func (m *chainModel) committed(k Key, g uint64) {
	t := m.clk.tick()
	m.mu.Lock()
	m.gens[k][g].commitEnd = t
	m.mu.Unlock()
}

func (m *chainModel) deleted(k Key, s span) {
	m.mu.Lock()
	m.dels[k] = append(m.dels[k], s)
	m.mu.Unlock()
}

func (m *chainModel) deletedNS(ns uint32, s span) {
	m.mu.Lock()
	m.nsDels[ns] = append(m.nsDels[ns], s)
	m.mu.Unlock()
}

// check decides whether bytes b, read for k by a read that started at
// readStart, are allowed: exactly the payload of a committed generation of
// k that no delete finished removing before the read started.
func (m *chainModel) check(k Key, size int64, b []byte, readStart int64) error {
	if int64(len(b)) != size {
		return fmt.Errorf("%v: read %d bytes, want %d", k, len(b), size)
	}
	g := binary.LittleEndian.Uint64(b)
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.gens[k][g]
	if r == nil {
		return fmt.Errorf("%v: read generation %d, never reserved for this key (torn or foreign bytes)", k, g)
	}
	if r.commitStart == 0 {
		return fmt.Errorf("%v: read generation %d, never committed", k, g)
	}
	if !bytes.Equal(b, modelPayload(k, g, size)) {
		return fmt.Errorf("%v: generation %d: torn bytes", k, g)
	}
	if r.commitEnd == 0 {
		return nil // committed concurrently with the read
	}
	for _, d := range m.dels[k] {
		if d.start > r.commitEnd && d.end < readStart {
			return fmt.Errorf("%v: read generation %d (committed at %d) that Delete [%d, %d] removed before the read began at %d",
				k, g, r.commitEnd, d.start, d.end, readStart)
		}
	}
	for _, d := range m.nsDels[k.NS] {
		if d.start > r.commitEnd && d.end < readStart {
			return fmt.Errorf("%v: read generation %d (committed at %d) that DeleteNS [%d, %d] removed before the read began at %d",
				k, g, r.commitEnd, d.start, d.end, readStart)
		}
	}
	return nil
}

func (m *chainModel) history(k Key) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := ""
	for g, r := range m.gens[k] {
		s += fmt.Sprintf("gen %d: commit [%d, %d]\n", g, r.commitStart, r.commitEnd)
	}
	for _, d := range m.dels[k] {
		s += fmt.Sprintf("delete [%d, %d]\n", d.start, d.end)
	}
	for _, d := range m.nsDels[k.NS] {
		s += fmt.Sprintf("deleteNS [%d, %d]\n", d.start, d.end)
	}
	return s
}

// modelPayload is the content of generation g of k: the generation number,
// then a stream that depends on both.
func modelPayload(k Key, g uint64, size int64) []byte {
	b := make([]byte, size)
	fillModel(b, k, g)
	return b
}

func fillModel(b []byte, k Key, g uint64) {
	binary.LittleEndian.PutUint64(b, g)
	x := k.Hash.Hi ^ k.Hash.Lo<<1 ^ uint64(k.NS)<<40 ^ g*0x2545f4914f6cdd1d
	i := 8
	for ; i+8 <= len(b); i += 8 {
		x = splitmix(x)
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < len(b); i++ {
		b[i] = byte(x >> (8 * (i % 8)))
	}
}

// modelNS describes a namespace of the run: its block size and keys.
type modelNS struct {
	ns   uint32
	size int64
	keys int
}

type modelVariant struct {
	name  string
	tmpfs int64 // mount a tmpfs of this size for the store (0: the test's temp dir)
	ttl   time.Duration
}

// TestChainModel runs random Reserve/Commit/Abort, Acquire/Release,
// Lookup, Delete, DeleteNS, Park/resume/release, Flush and capacity and
// watermark changes from several goroutines against a real Chain with a
// small host tier, a real NVMe store, the mover and promotions running.
// Every read must return the exact bytes of a committed generation of the
// key not deleted before the read began (or miss); at the end the
// accounting must be exact and every stored block valid.
func TestChainModel(t *testing.T) {
	dur := 1500 * time.Millisecond
	if *flagModelDur > 0 {
		dur = *flagModelDur
	}
	seed := *flagModelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	variants := []modelVariant{
		{name: "disk", ttl: time.Hour},
		// A filesystem smaller than the budget: Puts fail with ErrNoSpace.
		// Parked blocks expire meanwhile.
		{name: "tmpfs-full", tmpfs: 64 << 20, ttl: 300 * time.Millisecond},
	}
	for i, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			s := seed + uint64(i)
			t.Logf("seed %d (rerun with -chainmodel.seed=%d and the same variant)", s, s-uint64(i))
			runChainModel(t, v, s, dur)
		})
	}
}

func runChainModel(t *testing.T, v modelVariant, seed uint64, dur time.Duration) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	root := t.TempDir()
	if v.tmpfs > 0 {
		dir := filepath.Join(root, "tmpfs")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", v.tmpfs)); err != nil {
			t.Skipf("cannot mount tmpfs (needs root): %v", err)
		}
		defer unix.Unmount(dir, unix.MNT_DETACH)
		root = dir
	}
	nss := []modelNS{
		{ns: 1, size: 16 << 10, keys: 256},
		{ns: 2, size: 64 << 10, keys: 256},
		{ns: 3, size: 100 << 10, keys: 128},
		{ns: 4 | ParkedNS, size: 64 << 10, keys: 128},
		{ns: 5 | ParkedNS, size: 192 << 10, keys: 64},
	}
	const hostBytes, slabBytes = 6 << 20, 1 << 20
	h, err := NewHost(make([]byte, hostBytes), HostConfig{SlabBytes: slabBytes})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "nvme")
	openStore := func(capacity int64) *nvme.Store {
		store, err := nvme.Open(context.Background(), nvme.Options{
			Dir: dir, CapacityBytes: capacity, Logger: discardLogger(),
			Unevictable: func(k nvme.Key) bool { return k.NS&ParkedNS != 0 },
			GCInterval:  100 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		return store
	}
	store := openStore(nvme.MinCapacity)
	c, err := NewChain(h, store, ChainConfig{
		HighWatermark: 0.8, LowWatermark: 0.6, ParkTTL: v.ttl, PromoteQueue: 16,
		Logger: discardLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			c.Wait()
		}
	}
	defer func() {
		stop()
		store.Close()
	}()

	m := newChainModel()
	var failed atomic.Bool
	fail := func(format string, args ...any) {
		failed.Store(true)
		t.Errorf(format, args...)
	}
	keyOf := func(rng *rand.Rand) (Key, int64) {
		n := nss[rng.IntN(len(nss))]
		return Key{NS: n.ns, Hash: shm.Hash{Hi: uint64(n.ns)*0x9e3779b97f4a7c15 + 11, Lo: uint64(rng.IntN(n.keys))}}, n.size
	}
	sizeOf := func(ns uint32) int64 {
		for _, n := range nss {
			if n.ns == ns {
				return n.size
			}
		}
		panic("unknown ns")
	}

	type lease struct {
		hd    *Handle
		start int64
	}
	type resv struct {
		hd  *Handle
		gen uint64
	}
	var ops [16]atomic.Int64
	const (
		opPut = iota
		opAbort
		opGetHost
		opGetNVMe
		opMiss
		opLookup
		opDelete
		opDeleteNS
		opFlush
		opCapacity
		opResume
	)
	deadline := time.Now().Add(dur)
	const workers = 4
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)+1))
			var leases []lease
			var pending []resv
			release := func(i int) {
				l := leases[i]
				if err := m.check(l.hd.Key, l.hd.Size, h.Bytes(l.hd), l.start); err != nil {
					fail("bytes changed under a lease: %v", err)
				}
				if err := h.Release(l.hd); err != nil {
					fail("release %v: %v", l.hd.Key, err)
				}
				leases[i] = leases[len(leases)-1]
				leases = leases[:len(leases)-1]
			}
			finish := func(i int, commit bool) {
				r := pending[i]
				pending[i] = pending[len(pending)-1]
				pending = pending[:len(pending)-1]
				if !commit {
					if err := h.Abort(r.hd); err != nil {
						fail("abort %v: %v", r.hd.Key, err)
					}
					ops[opAbort].Add(1)
					return
				}
				k := r.hd.Key
				m.committing(k, r.gen)
				if err := h.Commit(r.hd); err != nil {
					fail("commit %v: %v", k, err)
					return
				}
				m.committed(k, r.gen)
				if k.Parked() {
					c.Park(k)
				} else {
					c.Inserted(k, policy.AccessInfo{})
				}
				c.Committed()
				ops[opPut].Add(1)
			}
			for !failed.Load() && time.Now().Before(deadline) {
				switch r := rng.IntN(1000); {
				case r < 280: // put
					k, size := keyOf(rng)
					hd, err := c.Reserve(k, size)
					if errors.Is(err, ErrExists) || errors.Is(err, ErrFull) {
						continue
					}
					if err != nil {
						fail("reserve %v: %v", k, err)
						continue
					}
					g := m.newGen(k)
					fillModel(h.Bytes(hd), k, g)
					pending = append(pending, resv{hd, g})
					if len(pending) > 2 || rng.IntN(3) > 0 {
						finish(rng.IntN(len(pending)), rng.IntN(10) > 0)
					}
				case r < 560: // get (a resume for a parked key)
					k, size := keyOf(rng)
					start := m.clk.tick()
					type res struct {
						hd  *Handle
						err error
					}
					ch := make(chan res, 1)
					hd, ok := c.Acquire(k, size, func(hd *Handle, err error) { ch <- res{hd, err} })
					promoted := ok && hd == nil
					switch {
					case !ok:
						ops[opMiss].Add(1)
						continue
					case hd != nil:
						ops[opGetHost].Add(1)
					default:
						select {
						case r := <-ch:
							if r.err != nil {
								if !errors.Is(r.err, ErrPromote) {
									fail("promotion of %v: unexpected error %v", k, r.err)
								}
								ops[opMiss].Add(1)
								continue
							}
							hd = r.hd
							ops[opGetNVMe].Add(1)
						case <-time.After(20 * time.Second):
							fail("promotion of %v never answered", k)
							continue
						}
					}
					if hd.Key != k || hd.Size != size {
						fail("acquire %v: got handle of %v (%d bytes)", k, hd.Key, hd.Size)
					}
					if err := m.check(k, size, h.Bytes(hd), start); err != nil {
						fail("read (promoted %v, in nvme now %v): %v\n%s", promoted, store.Contains(nk(k)), err, m.history(k))
					}
					if k.Parked() {
						ops[opResume].Add(1)
					}
					leases = append(leases, lease{hd, start})
					if len(leases) > 3 || rng.IntN(2) == 0 {
						release(rng.IntN(len(leases)))
					}
				case r < 660: // lookup of a run of consecutive keys
					k, _ := keyOf(rng)
					n := 1 + rng.IntN(8)
					chain := make([]Key, n)
					for i := range chain {
						chain[i] = k
						chain[i].Hash.Lo = (k.Hash.Lo + uint64(i)) % 64
					}
					tiersOut := make([]shm.Tier, n)
					hits, _ := c.Lookup(chain, tiersOut)
					if hits < 0 || hits > n {
						fail("lookup: %d hits of %d", hits, n)
					}
					for i := 0; i < hits; i++ {
						if tiersOut[i] != shm.TierHost && tiersOut[i] != shm.TierNVMe {
							fail("lookup: hit %d in tier %v", i, tiersOut[i])
						}
					}
					ops[opLookup].Add(1)
				case r < 800: // delete (a release for a parked key)
					k, _ := keyOf(rng)
					s := span{start: m.clk.tick()}
					c.Delete(k)
					s.end = m.clk.tick()
					m.deleted(k, s)
					ops[opDelete].Add(1)
				case r < 806: // delete a namespace
					ns := nss[rng.IntN(len(nss))].ns
					s := span{start: m.clk.tick()}
					c.DeleteNS(ns)
					s.end = m.clk.tick()
					m.deletedNS(ns, s)
					ops[opDeleteNS].Add(1)
				case r < 812: // flush, sometimes cut short
					fctx, fcancel := context.WithCancel(context.Background())
					if rng.IntN(3) == 0 {
						fcancel()
					}
					// A full store (the filesystem, or parked blocks filling the
					// budget) fails writes: the flush says so.
					if _, err := c.Flush(fctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, nvme.ErrNoSpace) {
						fail("flush: %v", err)
					}
					fcancel()
					ops[opFlush].Add(1)
				case r < 830: // capacity and watermark changes
					var err error
					switch rng.IntN(4) {
					case 0:
						err = c.SetCapacityRatio(0.3 + 0.7*rng.Float64())
					case 1:
						err = c.SetPressureRatio(0.3 + 0.7*rng.Float64())
					case 2:
						high := 0.3 + 0.7*rng.Float64()
						err = c.SetWatermarks(high, high*(0.3+0.6*rng.Float64()))
					case 3:
						err = store.SetCapacity(nvme.MinCapacity + rng.Int64N(64<<20))
					}
					if err != nil {
						fail("capacity change: %v", err)
					}
					ops[opCapacity].Add(1)
				default: // finish a reservation or drop a lease
					if len(pending) > 0 && rng.IntN(2) == 0 {
						finish(rng.IntN(len(pending)), rng.IntN(10) > 0)
					} else if len(leases) > 0 {
						release(rng.IntN(len(leases)))
					}
				}
			}
			for len(leases) > 0 {
				release(len(leases) - 1)
			}
			for len(pending) > 0 {
				finish(len(pending)-1, rng.IntN(2) == 0)
			}
		}()
	}
	wg.Wait()
	t.Logf("ops: put %d abort %d get host %d get nvme %d (resume %d) miss %d lookup %d delete %d deleteNS %d flush %d capacity %d",
		ops[opPut].Load(), ops[opAbort].Load(), ops[opGetHost].Load(), ops[opGetNVMe].Load(), ops[opResume].Load(),
		ops[opMiss].Load(), ops[opLookup].Load(), ops[opDelete].Load(), ops[opDeleteNS].Load(), ops[opFlush].Load(),
		ops[opCapacity].Load())
	st := c.Stats()
	ns := store.Stats()
	t.Logf("chain: %+v", st)
	t.Logf("nvme: blocks %d bytes %d evictions %d nospace %d", ns.Blocks, ns.Bytes, ns.Evictions, ns.NoSpace)
	if failed.Load() {
		return
	}

	// Quiesce: the mover stops; what Wait leaves must add up.
	stop()
	end := m.clk.tick()
	checkChainModelEnd(t, c, h, store, m, end, sizeOf)

	// The store's index survives a reopen unchanged (at the capacity last
	// set: Open evicts down to a lower one).
	capacity := store.Stats().Capacity
	before := map[nvme.Key]int64{}
	store.Keys(func(k nvme.Key, size int64) bool { before[k] = size; return true })
	if err := store.Close(); err != nil {
		t.Fatalf("close store: %v", err)
	}
	store = openStore(capacity)
	after := map[nvme.Key]int64{}
	store.Keys(func(k nvme.Key, size int64) bool { after[k] = size; return true })
	for k, size := range before {
		if after[k] != size {
			t.Errorf("after reopen, %v: %d bytes, before %d", k, after[k], size)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("after reopen, %v is back (not in the index before)", k)
		}
	}
}

// checkChainModelEnd checks a stopped chain: exact host accounting, no
// movement state left, every stored block a valid generation, the parked
// set equal to the parked blocks stored, the NVMe index consistent.
func checkChainModelEnd(t *testing.T, c *Chain, h *Host, store *nvme.Store, m *chainModel, end int64, sizeOf func(uint32) int64) {
	t.Helper()
	if err := checkHost(h); err != nil {
		t.Errorf("host tier invariants: %v", err)
	}
	hs := h.Stats()
	if hs.Reserved != 0 || hs.Leased != 0 {
		t.Errorf("after Wait: %d reserved, %d leased", hs.Reserved, hs.Leased)
	}
	var want int64
	h.mu.Lock()
	hostKeys := make([]*Handle, 0, len(h.index))
	for _, hd := range h.index {
		want += hd.Size
		hostKeys = append(hostKeys, hd)
	}
	h.mu.Unlock()
	if hs.UsedBytes != want {
		t.Errorf("host used bytes %d, blocks indexed sum to %d", hs.UsedBytes, want)
	}
	c.mu.Lock()
	if len(c.inflight) != 0 || len(c.deleting) != 0 || len(c.deletingNS) != 0 {
		t.Errorf("after Wait: %d promotions in flight, %d/%d deletes in progress", len(c.inflight), len(c.deleting), len(c.deletingNS))
	}
	c.mu.Unlock()
	c.parkMu.Lock()
	if len(c.parkRetry) != 0 || c.parkRetryBytes != 0 {
		t.Errorf("after Wait: %d parked blocks held for retry (%d bytes)", len(c.parkRetry), c.parkRetryBytes)
	}
	parked := make(map[Key]bool, len(c.parked))
	for k := range c.parked {
		parked[k] = true
	}
	c.parkMu.Unlock()

	stored := map[Key]bool{}
	for _, hd := range hostKeys {
		stored[hd.Key] = true
		if err := m.check(hd.Key, sizeOf(hd.Key.NS), h.Bytes(hd), end); err != nil {
			t.Errorf("host tier holds: %v", err)
		}
	}
	var nBlocks int
	var nBytes int64
	store.Keys(func(k nvme.Key, size int64) bool {
		nBlocks++
		nBytes += size
		key := Key{NS: k.NS, Hash: k.Hash}
		stored[key] = true
		dst := make([]byte, size)
		n, err := store.Get(k, dst)
		if err != nil || int64(n) != size {
			t.Errorf("nvme indexes %v (%d bytes) but reads %d bytes, %v", key, size, n, err)
			return true
		}
		if err := m.check(key, sizeOf(k.NS), dst, end); err != nil {
			t.Errorf("nvme holds: %v", err)
		}
		return true
	})
	if ss := store.Stats(); ss.Blocks != nBlocks || ss.Bytes != nBytes {
		t.Errorf("nvme stats: %d blocks %d bytes; index holds %d blocks %d bytes", ss.Blocks, ss.Bytes, nBlocks, nBytes)
	}
	for k := range parked {
		if !stored[k] {
			t.Errorf("parked set holds %v, which no tier stores", k)
		}
	}
	for k := range stored {
		if k.Parked() && !parked[k] {
			t.Errorf("parked block %v stored (host %v, nvme %v) but not in the parked set: it never expires",
				k, h.Contains(k), store.Contains(nk(k)))
		}
	}
}
