package tiers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers/nvme"
	"github.com/kvtier/kvtier/tiers/policy"
)

// ChainConfig tunes movement between the host tier and the NVMe tier.
type ChainConfig struct {
	// HighWatermark and LowWatermark are fractions of the host tier's
	// capacity: above high the mover demotes least-recently-used blocks to
	// NVMe until the tier is at low. Sync eviction inside Reserve remains
	// the backstop when the mover falls behind.
	HighWatermark, LowWatermark float64
	// PromoteWorkers copy blocks NVMe → host; PromoteQueue bounds the
	// prefetches waiting for them (demand promotions are never dropped).
	PromoteWorkers int
	PromoteQueue   int
	// ParkTTL bounds how long a parked request is kept without being
	// resumed or released.
	ParkTTL time.Duration
	// ParkedShare caps the parked blocks on NVMe at this fraction of its
	// logical budget (0 or 1: the whole budget, as ordinary blocks yield
	// to them): a Reserve of a parked block past it is ErrFull, so one
	// engine that parks without end cannot evict every other model's
	// cache, and the engine recomputes instead (a bounded swap space).
	// Parked blocks on their way down (in the host tier) count too.
	ParkedShare float64
	// ParkStatePath, if set, is where Wait stores the parked blocks'
	// expiries and the next NewChain reads them (Start removes them;
	// park_persist.go), so that a restart does not give them a fresh TTL.
	ParkStatePath string
	// Policy picks which host blocks the mover demotes (a tiers/policy
	// name; default policy.Default). The host tier's own LRU eviction stays
	// the backstop when the mover falls behind.
	Policy string
	Logger *slog.Logger
	// ObserveSwapIn and ObserveSwapOut, if set, are called for each block
	// promoted (NVMe → host, in copyUp) and written down (host → NVMe:
	// demotion, park, flush) with the time of the batch it moved in, from
	// mover goroutines. They keep metrics libraries out of this package.
	ObserveSwapIn, ObserveSwapOut func(time.Duration)
}

// ParkedNS is set in the namespace of parked blocks: the KV of a paused
// request, keyed by request id and block index, never shared by prefix.
// Namespace ids stay far below it.
const ParkedNS = 1 << 31

// Parked reports whether k belongs to a parked request.
func (k Key) Parked() bool { return k.NS&ParkedNS != 0 }

// Chain is the tier chain host → nvme: one index view over both tiers and
// the mover that demotes and promotes between them. A block's authoritative
// copy is in the host tier if it is there, else in NVMe; a block may keep a
// clean copy in NVMe while it is also in the host tier.
type Chain struct {
	Host *Host
	NVMe *nvme.Store // nil when the NVMe tier is off
	cfg  ChainConfig
	log  *slog.Logger
	wm   atomic.Pointer[watermarks] // cfg's, until SetWatermarks (watermarks.go)
	wmMu sync.Mutex                 // serializes updates of wm

	promoCh chan *promotion
	kick    chan struct{}
	// ioHook, if set (tests only, before Start), runs before every NVMe
	// read ("get") and write ("put") of the mover, to simulate a slow disk,
	// and after a promotion's read, before its commit ("read").
	ioHook func(op string, k Key)
	// promoteRun is promoteRunBytes, or what a benchmark sets before
	// Start to measure one block per read in the same run.
	promoteRun int64
	// diskFullUntil (nanos on monoClock): after a demotion failed for
	// lack of space the mover backs off until then instead of cycling
	// through blocks that cannot go down (each would become most recently
	// used and push recent puts out of the host tier). Monotonic: a wall
	// clock stepped back would stretch the back-off by the step.
	diskFullUntil atomic.Int64

	mu       sync.Mutex
	inflight map[Key]*promotion
	// stopped (mu): Wait ran; promotions fail at once and parked blocks
	// are not queued. stopCh, closed by Wait, releases the goroutines that
	// hand a promotion or a parked block to a full queue (handoffs).
	stopped bool
	// deleting/deletingNS (mu): Deletes and DeleteNSes in progress; a
	// promotion registered meanwhile is marked deleted at once (its read
	// may predate the delete's NVMe step, its commit follow its host step).
	deleting   map[Key]int
	deletingNS map[uint32]int
	stopCh     chan struct{}
	stopOnce   sync.Once
	handoffs   sync.WaitGroup
	// parkEarly (mu) holds the parked blocks a warm restart re-parks
	// before Start past parkCh's room, in order; Start hands them to the
	// writers. parkLive (mu): Start has run. Before it nothing drains
	// parkCh, so a handoff goroutine per block would wait there, one per
	// block of a large host tier.
	parkEarly []*Handle
	parkLive  bool
	// parked maps the blocks of parked requests to their expiry; parkCh
	// carries freshly parked (pinned) blocks to the write-through goroutine.
	parkMu sync.Mutex
	parked map[Key]time.Time
	parkCh chan *Handle
	// parkPrior (parkMu) holds the expiries a previous process stored,
	// for the parked blocks it left (a warm restart's Park, Start's scan
	// of NVMe); Start clears it.
	parkPrior map[Key]time.Time
	// parkKept (parkMu) holds the expiries a previous process stored when
	// this chain has no NVMe tier: Start cannot scan for the parked blocks
	// they belong to, which stay in NVMe for a later start, so Wait stores
	// them again rather than lose them. Nothing parked in this run is
	// among them (it is in parked), and no delete here reaches NVMe's.
	parkKept map[Key]time.Time
	// parkRetry (parkMu) holds parked blocks whose write-through failed
	// (disk budget full of parked blocks, a write error, too large for
	// NVMe): still pinned in the host tier, so not dropped for space, and
	// written down again at each tick of expireLoop.
	parkRetry []*Handle
	// parkRetryBytes (parkMu) is the size of parkRetry's blocks, held to
	// parkHoldShare of the host tier so that parks failing against a full
	// disk cannot pin the whole host tier for their TTL.
	parkRetryBytes int64
	// parkLater (parkMu) holds parked blocks whose write-through failed
	// past parkHoldShare: unpinned (the host tier may drop them for
	// space), they are not tracked by the policy either, so nothing else
	// writes them down; expireLoop tries them again once the retries go
	// through (the disk has room again).
	parkLater []*Handle
	// parkDelMu serializes the deletes of parked blocks (a resume or a
	// release) with expireLoop's check-and-delete of an expired one, so
	// that the expiry deletes only the block whose TTL passed: a request
	// resumed and parked again under the same id meanwhile keeps its new
	// blocks, and is not counted expired.
	parkDelMu sync.Mutex
	// expireHook, if set (tests only, before Start), runs in expireLoop
	// before each expired key is deleted.
	expireHook func(k Key)
	// deleteHook, if set (tests only, before Start), runs in Delete and
	// DeleteNS between the host step and the NVMe step, with the key
	// (Key{NS: ns} for DeleteNS, once per namespace for DeleteNamespaces).
	deleteHook func(k Key)

	// The replacement policy sees the host tier through events (insert,
	// access, remove) applied by policyLoop, so ring loops never wait on
	// it; once Start ran, events are dropped (counted) when the queue is
	// full (a block whose insert was dropped enters at its next access:
	// trackAccessed), and stale
	// policy state heals when a victim turns out to be gone. polKeys
	// guards the policy against duplicate inserts and unknown removals,
	// and holds each tracked block's place in its chain as the policy was
	// told it, for a demotion victim handed back (its write failed, or it
	// was leased meanwhile): inserted again without it, a block becomes a
	// parentless root and its parent a leaf.
	pmu     sync.Mutex
	pol     policy.Policy
	polKeys map[policy.Key]polPlace
	// Blocks the policy refused to admit stay in the host tier until
	// space is needed, then go first and are dropped without being written
	// to NVMe: the policy judged them not worth keeping.
	unadmitted    []policy.Key
	unadmittedSet map[policy.Key]struct{}
	polCh         chan polEvent
	lookups       atomic.Uint64
	// polLive: Start has started policyLoop. Before it nothing drains
	// polCh, and a warm restart adopts any number of blocks: events past
	// its bound wait in polEarly (earlyMu; never held while taking another
	// lock), unbounded, and policyLoop applies them first, in order.
	polLive  atomic.Bool
	earlyMu  sync.Mutex
	polEarly []polEvent

	// demoteMu serializes demotion passes (the demoter and promotion
	// workers making room) so they do not pin the same cold blocks.
	demoteMu sync.Mutex

	wg sync.WaitGroup

	nvmeHits, nvmeMisses      atomic.Uint64
	demoted, demotedBytes     atomic.Uint64
	promoted, promotedBytes   atomic.Uint64
	demoteErrors, promoteErrs atomic.Uint64
	prefetches, prefetchDrops atomic.Uint64
	parkRefused               atomic.Uint64 // parked reservations refused by ParkedShare
	parkErrors, parkExpired   atomic.Uint64
	polDrops                  atomic.Uint64
	promoteLost               atomic.Uint64
	refusedDrops              atomic.Uint64
	oversizeDrops             atomic.Uint64
	swapInNanos, swapOutNanos atomic.Uint64
}

// ErrPromote reports that a block was in NVMe but could not be brought up.
var ErrPromote = errors.New("promotion from nvme failed")

type promotion struct {
	key  Key
	size int64
	// info (Chain.mu): the block's place in the chain a lookup found it
	// in, for the policy when the block is committed (zero when only an
	// acquire asked for it).
	info    policy.AccessInfo
	waiters []func(*Handle, error)
	// deleted (Chain.mu): the block was deleted while being promoted; the
	// copy read before the delete must not be committed.
	deleted bool
	// late (Chain.mu): acquires that came after the delete, for a block
	// put again since: this promotion's failure is not theirs; finish
	// starts a promotion of their own.
	late []func(*Handle, error)
	// res (Chain.mu): the host reservation copyUp holds for the block
	// while it reads it. Once deleted is set it is never committed, and
	// Reserve takes its place in the host index from it (Host.Disown).
	res *Handle
}

type polOp uint8

const (
	polInsert polOp = iota
	// polPromoted: a block brought up from NVMe was committed. Its place
	// in the chain counts while its parent is tracked; without it (demoted
	// meanwhile, or still coming up) it enters as a root, as a block
	// whose place is unknown, not as an orphan to refuse: its copy below
	// is intact and it was admitted before.
	polPromoted
	// polBack: a demotion victim the mover hands back (its write failed,
	// or it was leased meanwhile), with the place it had (polPlace): like
	// polPromoted, below its parent while that is tracked, a root without.
	polBack
	polAccess
	polRemove
	polLookup
)

type polEvent struct {
	op polOp
	k  policy.Key
	a  policy.AccessInfo
	// polLookup: the host-resident blocks of a lookup's hit prefix, sent
	// as one event so that a long chain costs one channel send, not one
	// per block. a carries the lookup's request number, time and chain
	// length; pos[i] is chain[i]'s position, parent[i] its predecessor.
	chain  []policy.Key
	pos    []int32
	parent []policy.Key
}

// polPlace is a tracked block's place in its chain, as the policy's
// Insert was told it.
type polPlace struct {
	parent    policy.Key
	pos       int32
	hasParent bool
}

func placeOf(a policy.AccessInfo) polPlace {
	return polPlace{parent: a.Parent, pos: int32(min(a.Pos, math.MaxInt32)), hasParent: a.HasParent}
}

// info is the place as the policy's AccessInfo.
func (p polPlace) info() policy.AccessInfo {
	return policy.AccessInfo{Pos: int(p.pos), Parent: p.parent, HasParent: p.hasParent}
}

func pk(k Key) policy.Key { return policy.Key{NS: k.NS, Hi: k.Hash.Hi, Lo: k.Hash.Lo} }

func fromPK(k policy.Key) Key { return Key{NS: k.NS, Hash: shm.Hash{Hi: k.Hi, Lo: k.Lo}} }

// NewChain ties host and (optionally) nvme together. Start runs the mover.
func NewChain(host *Host, store *nvme.Store, cfg ChainConfig) (*Chain, error) {
	if cfg.HighWatermark <= 0 || cfg.HighWatermark > 1 {
		cfg.HighWatermark = 0.95
	}
	if cfg.LowWatermark <= 0 || cfg.LowWatermark >= cfg.HighWatermark {
		cfg.LowWatermark = cfg.HighWatermark * 0.9
	}
	if cfg.PromoteWorkers <= 0 {
		cfg.PromoteWorkers = 2
	}
	if cfg.PromoteQueue <= 0 {
		cfg.PromoteQueue = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ParkTTL <= 0 {
		cfg.ParkTTL = time.Hour
	}
	if cfg.Policy == "" {
		cfg.Policy = policy.Default
	}
	_, capacity := host.Usage()
	// The policy's size hint, in blocks, assuming 1 MiB blocks: the block
	// size is the client's. The size-dependent policies (density, arc,
	// s3fifo, lru2) size themselves to the blocks the tier holds
	// (policy/size.go); lrb keeps the hint.
	pol, err := policy.New(cfg.Policy, int(max(capacity>>20, 1024)))
	if err != nil {
		return nil, err
	}
	c := &Chain{
		Host: host, NVMe: store, cfg: cfg, log: cfg.Logger,
		promoCh:  make(chan *promotion, cfg.PromoteQueue),
		stopCh:   make(chan struct{}),
		kick:     make(chan struct{}, 1),
		inflight: map[Key]*promotion{},
		deleting: map[Key]int{}, deletingNS: map[uint32]int{},
		parked:  map[Key]time.Time{},
		parkCh:  make(chan *Handle, 4096),
		pol:     pol,
		polKeys: map[policy.Key]polPlace{},

		unadmittedSet: map[policy.Key]struct{}{},
		polCh:         make(chan polEvent, 1<<16),
		promoteRun:    promoteRunBytes,
	}
	c.wm.Store(&watermarks{high: cfg.HighWatermark, low: cfg.LowWatermark, capRatio: 1, pressure: 1})
	c.parkPrior = c.loadParkState()
	host.SetOnRemove(func(k Key) {
		c.note(polEvent{op: polRemove, k: pk(k)})
		if k.Parked() && !c.inNVMe(k) {
			// Evicted from its last tier (a parked block the host tier
			// dropped to make room, without NVMe or before it was written
			// through): the request no longer holds it. Under the host's
			// lock; parkMu is never held while taking it.
			c.parkMu.Lock()
			delete(c.parked, k)
			c.parkMu.Unlock()
		}
	})
	return c, nil
}

// PolicyName is the replacement policy in use.
func (c *Chain) PolicyName() string { return c.pol.Name() }

func (c *Chain) note(ev polEvent) {
	if c.NVMe == nil {
		return // nothing to demote to: the policy would never be asked
	}
	if !c.polLive.Load() && c.noteEarly(ev) {
		return
	}
	select {
	case c.polCh <- ev:
	default:
		c.polDrops.Add(1)
	}
}

// noteEarly queues ev if policyLoop has not started, and reports whether
// it did. Once polCh is full, ev and every later event wait in polEarly,
// so that they are applied in the order they came.
func (c *Chain) noteEarly(ev polEvent) bool {
	c.earlyMu.Lock()
	defer c.earlyMu.Unlock()
	if c.polLive.Load() {
		return false
	}
	if len(c.polEarly) == 0 {
		select {
		case c.polCh <- ev:
			return true
		default:
		}
	}
	c.polEarly = append(c.polEarly, ev)
	return true
}

// Inserted tells the policy a block was committed to the host tier. a
// describes the block's place in the chain the client looked up, if known.
func (c *Chain) Inserted(k Key, a policy.AccessInfo) {
	c.note(polEvent{op: polInsert, k: pk(k), a: a})
}

// Accessed tells the policy a host-resident block was referenced.
func (c *Chain) Accessed(k Key, a policy.AccessInfo) {
	c.note(polEvent{op: polAccess, k: pk(k), a: a})
}

// policyLoop applies policy events in batches: first the events noted
// before Start, the queued ones of polCh (the first queued) then early,
// then polCh's as they come (those noted since Start are behind the
// queued ones).
func (c *Chain) policyLoop(ctx context.Context, queued int, early []polEvent) {
	for (queued > 0 || len(early) > 0) && ctx.Err() == nil {
		c.pmu.Lock() // per batch, as below: a demotion pass waits for one batch
		for i := 0; i < 256 && (queued > 0 || len(early) > 0); i++ {
			if queued > 0 {
				c.apply(<-c.polCh)
				queued--
			} else {
				c.apply(early[0])
				early[0] = polEvent{}
				early = early[1:]
			}
		}
		c.pmu.Unlock()
	}
	for {
		var ev polEvent
		select {
		case <-ctx.Done():
			return
		case ev = <-c.polCh:
		}
		c.pmu.Lock()
		c.apply(ev)
		for i := 0; i < 255; i++ {
			select {
			case ev = <-c.polCh:
				c.apply(ev)
				continue
			default:
			}
			break
		}
		c.pmu.Unlock()
	}
}

// apply runs one event; pmu held.
func (c *Chain) apply(ev polEvent) {
	_, known := c.polKeys[ev.k]
	switch ev.op {
	case polInsert, polPromoted, polBack:
		if ev.op != polInsert && ev.a.HasParent {
			if _, ok := c.polKeys[ev.a.Parent]; !ok {
				ev.a.HasParent, ev.a.Parent = false, policy.Key{}
			}
		}
		if !known && !c.Host.Contains(fromPK(ev.k)) {
			// Gone already (a mover's "track it again" raced a delete or
			// an eviction): its removal event, queued before or after
			// this one, finds nothing to remove, and the policy must not
			// track a block the tier does not hold.
			break
		}
		if known {
			c.pol.Access(ev.k, ev.a)
		} else if c.pol.Admit(ev.k, ev.a) {
			c.pol.Insert(ev.k, ev.a)
			c.polKeys[ev.k] = placeOf(ev.a)
		} else {
			c.queueRefused(ev.k)
		}
	case polAccess:
		if known {
			c.pol.Access(ev.k, ev.a)
		} else {
			c.trackAccessed(ev.k, ev.a)
		}
	case polRemove:
		if known {
			c.pol.Remove(ev.k)
			delete(c.polKeys, ev.k)
		}
		delete(c.unadmittedSet, ev.k) // its queue entry is skipped later
		if n := len(c.unadmitted); n > 64 && n > 2*len(c.unadmittedSet) {
			// Mostly stale entries: only a demotion pass pops the queue,
			// so below the high watermark it would grow with every
			// refused put that is deleted.
			live := c.unadmitted[:0]
			seen := make(map[policy.Key]struct{}, len(c.unadmittedSet))
			for _, k := range c.unadmitted {
				_, in := c.unadmittedSet[k]
				if _, dup := seen[k]; in && !dup {
					seen[k] = struct{}{}
					live = append(live, k)
				}
			}
			clear(c.unadmitted[len(live):])
			c.unadmitted = live
		}
	case polLookup:
		for i, k := range ev.chain {
			a := ev.a
			a.Pos, a.HasParent = int(ev.pos[i]), ev.pos[i] > 0
			if a.HasParent {
				a.Parent = ev.parent[i]
			}
			if _, ok := c.polKeys[k]; ok {
				c.pol.Access(k, a)
			} else {
				c.trackAccessed(k, a) // parents first: the chain is in order
			}
		}
	}
}

// trackAccessed enters k, accessed but not tracked, if the host tier
// holds it and the policy has not refused it: its insert was dropped on a
// full queue (or is still queued behind this access), and without this it
// would stay untracked for good, never picked for demotion while the
// policy has victims. Like a promoted block, it keeps its parent only
// while that is tracked. pmu held.
func (c *Chain) trackAccessed(k policy.Key, a policy.AccessInfo) {
	if _, refused := c.unadmittedSet[k]; refused {
		return // tracked as refused: dropped first when room is needed
	}
	if a.HasParent {
		if _, ok := c.polKeys[a.Parent]; !ok {
			a.HasParent, a.Parent = false, policy.Key{}
		}
	}
	if !c.Host.Contains(fromPK(k)) {
		return // gone since: its removal event finds nothing to remove
	}
	if c.pol.Admit(k, a) {
		c.pol.Insert(k, a)
		c.polKeys[k] = placeOf(a)
	} else {
		c.queueRefused(k)
	}
}

// queueRefused puts k, a block the policy refused, on the queue of blocks
// the mover drops first, once. pmu held.
func (c *Chain) queueRefused(k policy.Key) {
	if _, queued := c.unadmittedSet[k]; !queued {
		c.unadmittedSet[k] = struct{}{}
		c.unadmitted = append(c.unadmitted, k)
	}
}

// polVictims are the blocks a demotion pass took out of the policy: each
// one's place in its chain (places), the order the policy chose them in,
// and those a reader held leased (still resident, not pinned).
type polVictims struct {
	places map[policy.Key]polPlace
	order  []policy.Key
	leased []policy.Key
}

// pinVictims pins up to n host blocks the policy wants demoted, falling
// back to the host tier's LRU order when the policy has none (blocks it
// did not admit, or state lost to dropped events). pv holds the victims it
// took out of the policy, for handBackAll: the leased ones among them go
// back with the pass's other victims that stay, not one by one as met (the
// next victim is often the parent of one just met, which would be gone
// from the policy when its child went back).
func (c *Chain) pinVictims(n int) (out []*Handle, drop int, pv polVictims) {
	// Refused blocks first; they are dropped, not written down.
	c.pmu.Lock()
	var refused []policy.Key
	for len(c.unadmitted) > 0 && len(refused) < n {
		k := c.unadmitted[0]
		c.unadmitted = c.unadmitted[1:]
		if _, ok := c.unadmittedSet[k]; ok {
			delete(c.unadmittedSet, k)
			refused = append(refused, k)
		}
	}
	if len(c.unadmitted) == 0 {
		c.unadmitted = nil // let the backing array go
	}
	c.pmu.Unlock()
	var leased []policy.Key
	for _, k := range refused {
		if hd, ok := c.Host.PinUnleased(fromPK(k)); ok {
			out = append(out, hd)
		} else if c.Host.Contains(fromPK(k)) {
			leased = append(leased, k) // in use: still refused, ask again next pass
		}
	}
	if len(leased) > 0 {
		c.pmu.Lock()
		for _, k := range leased {
			if _, known := c.polKeys[k]; !known {
				c.queueRefused(k)
			}
		}
		c.pmu.Unlock()
	}
	drop = len(out)
	for tries := 0; len(out) < n && tries < 4*n; tries++ {
		c.pmu.Lock()
		k, ok := c.pol.Victim()
		var place polPlace
		if ok {
			place = c.polKeys[k]
			c.pol.Remove(k)
			delete(c.polKeys, k)
		}
		c.pmu.Unlock()
		if !ok {
			break
		}
		if pv.places == nil {
			pv.places = map[policy.Key]polPlace{}
		}
		pv.places[k] = place
		pv.order = append(pv.order, k)
		if hd, ok := c.Host.PinUnleased(fromPK(k)); ok {
			out = append(out, hd)
		} else if c.Host.Contains(fromPK(k)) {
			// Leased right now: it is in use, so keep tracking it.
			pv.leased = append(pv.leased, k)
		}
	}
	if len(out) == 0 {
		out = c.Host.PinColdest(n, nil)
	}
	return out, drop, pv
}

// handBackAll tells the policy that the victims in stay remain in the
// host tier: those pinVictims took out of the policy go back in their
// place in the chain, in the reverse of the order it chose them (a parent,
// chosen after its child once that left the policy, goes back first, so
// that its child goes back below it); the others (victims of the host's
// LRU order) as blocks of unknown place.
func (c *Chain) handBackAll(pv polVictims, stay map[policy.Key]bool) {
	for i := len(pv.order) - 1; i >= 0; i-- {
		if k := pv.order[i]; stay[k] {
			delete(stay, k)
			c.note(polEvent{op: polBack, k: k, a: pv.places[k].info()})
		}
	}
	for k := range stay {
		c.note(polEvent{op: polInsert, k: k})
	}
}

// Start runs the demoter and the promotion workers until ctx ends; Wait
// returns when they have exited.
func (c *Chain) Start(ctx context.Context) {
	c.parkMu.Lock()
	prior := c.parkPrior
	c.parkPrior = nil // a block parked from now on is a new request's
	if c.NVMe == nil {
		c.parkKept = prior // never scanned: Wait stores them again
	}
	c.parkMu.Unlock()
	c.dropParkState() // taken over: Wait stores them again
	if c.NVMe == nil {
		return
	}
	// Parked blocks that survived a restart in NVMe keep the expiry the
	// previous process stored, else (after a crash) get a fresh TTL. A
	// warm restart's Park recorded those still in the host tier already.
	expiry := time.Now().Add(c.cfg.ParkTTL)
	c.parkMu.Lock()
	c.NVMe.Keys(func(k nvme.Key, _ int64) bool {
		if key := (Key{NS: k.NS, Hash: k.Hash}); key.Parked() {
			if _, ok := c.parked[key]; !ok {
				c.parked[key] = expiry
				if exp, ok := prior[key]; ok {
					c.parked[key] = exp
				}
			}
		}
		return true
	})
	c.parkMu.Unlock()
	// From here on events go to polCh only, behind those noted before.
	c.earlyMu.Lock()
	queued, early := len(c.polCh), c.polEarly
	c.polEarly = nil
	c.polLive.Store(true)
	c.earlyMu.Unlock()
	c.mu.Lock()
	parkEarly := c.parkEarly
	c.parkEarly, c.parkLive = nil, true
	c.mu.Unlock()
	if len(parkEarly) > 0 {
		// Behind those parkCh holds, in the order they were parked.
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for i, hd := range parkEarly {
				select {
				case c.parkCh <- hd:
				case <-ctx.Done():
					for _, hd := range parkEarly[i:] {
						c.Host.Unpin(hd, false) // stays in the host tier: Flush writes it
					}
					return
				}
			}
		}()
	}
	c.wg.Add(3 + demoteWriters() + c.cfg.PromoteWorkers)
	go func() {
		defer c.wg.Done()
		c.policyLoop(ctx, queued, early)
	}()
	go func() {
		defer c.wg.Done()
		c.demoteLoop(ctx)
	}()
	for range demoteWriters() { // write-through as demotion: one writer per CPU, up to 4
		go func() {
			defer c.wg.Done()
			c.parkLoop(ctx)
		}()
	}
	go func() {
		defer c.wg.Done()
		c.expireLoop(ctx)
	}()
	for i := 0; i < c.cfg.PromoteWorkers; i++ {
		go func() {
			defer c.wg.Done()
			c.promoteLoop(ctx)
		}()
	}
}

// Wait blocks until the goroutines started by Start have exited. Demand
// promotions still queued are failed; parked blocks not yet written down
// stay in the host tier (Flush or FlushParked writes them).
func (c *Chain) Wait() {
	c.wg.Wait()
	c.mu.Lock()
	c.stopped = true // no new promotion or handoff from here on
	c.mu.Unlock()
	c.stopOnce.Do(func() { close(c.stopCh) })
	c.handoffs.Wait() // each has queued its item or given it up
	for drained := false; !drained; {
		select {
		case hd := <-c.parkCh:
			c.Host.Unpin(hd, false)
		default:
			drained = true
		}
	}
	c.mu.Lock()
	parkEarly := c.parkEarly // stopped without Start
	c.parkEarly = nil
	c.mu.Unlock()
	for _, hd := range parkEarly {
		c.Host.Unpin(hd, false)
	}
	c.parkMu.Lock()
	retry := c.parkRetry
	c.parkRetry, c.parkRetryBytes = nil, 0
	c.parkLater = nil // unpinned: they stay in the host tier (FlushParked)
	c.parkMu.Unlock()
	for _, hd := range retry {
		c.Host.Unpin(hd, false)
	}
	c.mu.Lock()
	left := make([]*promotion, 0, len(c.inflight))
	for _, p := range c.inflight {
		left = append(left, p)
	}
	c.mu.Unlock()
	for _, p := range left { // queued, or given up by its handoff
		c.finish(p, ErrPromote)
	}
	for drained := false; !drained; {
		select {
		case <-c.promoCh: // finished above
		default:
			drained = true
		}
	}
	c.storeParkState()
}

func nk(k Key) nvme.Key { return nvme.Key{NS: k.NS, Hash: k.Hash} }

// inNVMe reports whether the NVMe tier holds key.
func (c *Chain) inNVMe(k Key) bool { return c.NVMe != nil && c.NVMe.Contains(nk(k)) }

// Lookup returns how many leading keys of chain are cached in any tier and
// the tier of each, and the request number that ChainInfo uses for this
// chain. Blocks found only in NVMe are queued for promotion: a lookup
// announces reads.
func (c *Chain) Lookup(chain []Key, tiers []shm.Tier) (hits int, req uint64) {
	return c.lookup(chain, tiers, nil)
}

// lookup is Lookup with another tier consulted for the keys the chain's
// tiers miss (the GPU tier): above(i) reports whether it holds chain[i] (and
// sets tiers[i]). The whole chain is one request to the policy, so blocks
// after one held above keep their place and parent.
func (c *Chain) lookup(chain []Key, tiers []shm.Tier, above func(i int) bool) (hits int, req uint64) {
	req = c.lookups.Add(1)
	i := 0
	defer func() { c.noteLookup(chain, tiers, i, req) }()
	var nowMs int64
	for i < len(chain) {
		i += c.Host.Lookup(chain[i:], tiers[i:])
		if i == len(chain) {
			break
		}
		// The tier above first: a block it holds is a hit there, not a
		// prefetch from NVMe (which may hold a copy too).
		if above == nil || !above(i) {
			if !c.inNVMe(chain[i]) {
				break
			}
			tiers[i] = shm.TierNVMe
			if nowMs == 0 {
				nowMs = time.Now().UnixMilli()
			}
			// Promoted, the block enters the policy with its place in
			// this chain, as a put of it would.
			c.prefetch(chain[i], ChainInfo(chain, i, req, nowMs))
		}
		i++
	}
	return i, req
}

// Reserve reserves a host slot for a new block; a block cached in any tier
// is ErrExists (a duplicate put is a no-op).
func (c *Chain) Reserve(k Key, size int64) (*Handle, error) {
	if c.inNVMe(k) {
		return nil, ErrExists
	}
	if k.Parked() && c.parkedOverShare(size) {
		if c.Host.Present(k) && !c.disownDeletedPromotion(k) {
			return nil, ErrExists // a duplicate: the share refuses nothing
		}
		c.parkRefused.Add(1)
		return nil, fmt.Errorf("%w: parked blocks hold their share of the nvme tier", ErrFull)
	}
	hd, err := c.Host.Reserve(k, size)
	if errors.Is(err, ErrExists) && c.disownDeletedPromotion(k) {
		// The key was held by the reservation of a promotion of a block
		// deleted since (it will not be committed): the block is gone, and
		// this put must not be dropped as a duplicate.
		hd, err = c.Host.Reserve(k, size)
	}
	return hd, err
}

// parkedOverShare reports whether a parked block of size bytes would take
// the parked blocks past ChainConfig.ParkedShare of NVMe's budget: those on
// NVMe and those on their way there (in the host tier, reserved or queued
// for their write-through). A block is counted twice only between its
// write to NVMe and the drop of its host copy. Reservations checked at the
// same moment may each pass: the cap can be overshot by one block per
// concurrent Reserve.
func (c *Chain) parkedOverShare(size int64) bool {
	share := c.cfg.ParkedShare
	if c.NVMe == nil || share <= 0 || share >= 1 {
		return false
	}
	held := c.NVMe.UnevictableBytes() + c.Host.ParkedBytes()
	return float64(held+size) > share*float64(c.NVMe.LogicalBudget())
}

// disownDeletedPromotion takes k's place in the host index from the
// reservation of a promotion that a Delete marked, and reports whether it
// did. The promotion keeps its slot until it aborts it.
func (c *Chain) disownDeletedPromotion(k Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.inflight[k]
	return p != nil && p.deleted && p.res != nil && c.Host.Disown(p.res)
}

// noteLookup reports the host-resident blocks of a lookup's hit prefix to
// the policy, with their place in the chain.
func (c *Chain) noteLookup(chain []Key, tiers []shm.Tier, hits int, req uint64) {
	if c.NVMe == nil {
		return
	}
	ev := polEvent{op: polLookup, a: policy.AccessInfo{ChainLen: len(chain), Request: req, TimeMs: time.Now().UnixMilli()}}
	ev.chain, ev.pos, ev.parent = make([]policy.Key, 0, hits), make([]int32, 0, hits), make([]policy.Key, 0, hits)
	for i := 0; i < hits; i++ {
		if tiers[i] != shm.TierHost {
			continue
		}
		ev.chain = append(ev.chain, pk(chain[i]))
		ev.pos = append(ev.pos, int32(i))
		var par policy.Key
		if i > 0 {
			par = pk(chain[i-1])
		}
		ev.parent = append(ev.parent, par)
	}
	if len(ev.chain) > 0 {
		c.note(ev)
	}
}

// ChainInfo describes block i of a looked-up chain for the policy.
func ChainInfo(chain []Key, i int, req uint64, nowMs int64) policy.AccessInfo {
	a := policy.AccessInfo{Pos: i, ChainLen: len(chain), Request: req, TimeMs: nowMs, HasParent: i > 0}
	if i > 0 {
		a.Parent = pk(chain[i-1])
	}
	return a
}

// Acquire leases key in the host tier. If it is only in NVMe, Acquire
// returns (nil, true) and calls done from a mover goroutine once the block
// has been promoted and leased (or with an error); the caller must not
// block waiting. (nil, false) is a miss.
func (c *Chain) Acquire(k Key, size int64, done func(*Handle, error)) (*Handle, bool) {
	if hd, ok := c.Host.Acquire(k); ok {
		return hd, true
	}
	return c.acquireBelow(k, size, done)
}

// acquireBelow is Acquire after the host tier missed (and counted the
// miss): a hit in NVMe is promoted, else it is a miss of the whole chain.
// A caller that tried the host tier itself (GPUSet.Acquire) continues here,
// so that one get is one host miss.
func (c *Chain) acquireBelow(k Key, size int64, done func(*Handle, error)) (*Handle, bool) {
	if !c.inNVMe(k) {
		c.nvmeMisses.Add(1)
		return nil, false
	}
	if done == nil { // no lease wanted: counted as promised
		c.nvmeHits.Add(1)
		c.promote(k, size, nil)
		return nil, true
	}
	// Counted when the promotion is done: one that fails (the block failed
	// verification or left NVMe before it was read) is answered as a miss.
	c.promote(k, size, func(hd *Handle, err error) {
		if err != nil {
			c.nvmeMisses.Add(1)
		} else {
			c.nvmeHits.Add(1)
		}
		done(hd, err)
	})
	return nil, true
}

func (c *Chain) prefetch(k Key, info policy.AccessInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	if p := c.inflight[k]; p != nil {
		if p.info.ChainLen == 0 {
			p.info = info // an acquire's promotion: now its place is known
		}
		return
	}
	p := &promotion{key: k, info: info, deleted: c.beingDeletedLocked(k)}
	size, ok := c.NVMe.Size(nk(k))
	if !ok {
		return
	}
	p.size = size
	select {
	case c.promoCh <- p:
		c.inflight[k] = p
		c.prefetches.Add(1)
	default:
		c.prefetchDrops.Add(1) // bounded queue: a prefetch may be skipped
	}
}

func (c *Chain) promote(k Key, size int64, done func(*Handle, error)) {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		if done != nil {
			go done(nil, fmt.Errorf("%w: the chain is stopped", ErrPromote))
		}
		return
	}
	if p := c.inflight[k]; p != nil {
		if p.deleted {
			p.late = append(p.late, done)
		} else {
			p.waiters = append(p.waiters, done)
		}
		c.mu.Unlock()
		return
	}
	p := &promotion{key: k, size: size, waiters: []func(*Handle, error){done}, deleted: c.beingDeletedLocked(k)}
	c.inflight[k] = p
	select {
	case c.promoCh <- p:
	default:
		// A demand promotion is never dropped; the sender is bounded by the
		// session's ring size. Wait fails it if it is still not queued.
		c.handoffs.Add(1)
		go func() {
			defer c.handoffs.Done()
			select {
			case c.promoCh <- p:
			case <-c.stopCh:
			}
		}()
	}
	c.mu.Unlock()
}

// promoteRunBytes bounds the blocks one promotion worker brings up at
// once: it takes what is queued, up to this many bytes (at least one
// block), and reads them with one nvme GetBatch, which reads records lying
// back to back on disk with one I/O. A lookup queues a prefix's NVMe
// blocks together, and the mover wrote them in runs. Direct reads of
// 64 KiB ran at 368 MB/s, of 1 MiB at 1.2 GB/s (docs/benchmarks.md,
// "Batched promotion"); blocks of 1 MiB and more go one at a time, so a
// demand read never waits behind another large block.
const promoteRunBytes = 1 << 20

func (c *Chain) promoteLoop(ctx context.Context) {
	var run []*promotion
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-c.promoCh:
			run = append(run[:0], p)
			bytes := p.size
		more:
			for bytes < c.promoteRun {
				select {
				case q := <-c.promoCh:
					run = append(run, q)
					bytes += q.size
				default:
					break more
				}
			}
			errs, held := c.copyUp(run)
			for i, p := range run {
				c.finish(p, errs[i])
				if held[i] != nil {
					c.Host.Unpin(held[i], false)
				}
			}
			clear(run) // let the promotions go
		}
	}
}

// copyUp brings a run of blocks from NVMe into host slots, with one batched
// read, and returns the outcome of each.
func (c *Chain) copyUp(run []*promotion) (errs []error, held []*Handle) {
	t0 := time.Now()
	errs, held = make([]error, len(run)), make([]*Handle, len(run))
	var total int64
	sizes := make([]int64, len(run))
	for i, p := range run {
		total += p.size
		sizes[i] = p.size
	}
	// Make room by demotion first: the host tier's own eviction would drop
	// blocks that have no copy in NVMe yet. This runs on a mover goroutine,
	// never on a ring loop.
	c.makeRoom(total, len(run), sizes...)
	var (
		keys []nvme.Key
		dsts [][]byte
		hds  []*Handle
		idx  []int
	)
	for i, p := range run {
		c.mu.Lock() // p.res is set with the reservation, for Reserve
		hd, err := c.Host.ReserveCopy(p.key, p.size)
		if err == nil {
			p.res = hd
		}
		c.mu.Unlock()
		if errors.Is(err, ErrExists) {
			continue // put or promoted meanwhile
		}
		if err != nil {
			c.promoteErrs.Add(1)
			errs[i] = fmt.Errorf("%w: reserve host slot: %w", ErrPromote, err)
			continue
		}
		if c.ioHook != nil {
			c.ioHook("get", p.key)
		}
		keys, dsts, hds, idx = append(keys, nk(p.key)), append(dsts, c.Host.Bytes(hd)), append(hds, hd), append(idx, i)
	}
	if len(keys) == 0 {
		return errs, held
	}
	ns, rerrs := c.NVMe.GetBatch(keys, dsts)
	dt := time.Since(t0) // each block of the run waited for all of it
	for j, hd := range hds {
		i, p := idx[j], run[idx[j]]
		if err := rerrs[j]; err != nil || int64(ns[j]) != p.size {
			c.Host.Abort(hd)
			if errors.Is(err, nvme.ErrNotFound) && !errors.Is(err, nvme.ErrChecksum) {
				// Evicted from NVMe between the lookup and the read: a
				// miss, not a fault.
				c.promoteLost.Add(1)
			} else {
				c.promoteErrs.Add(1)
			}
			c.forgetParkedIfGone(p.key) // dropped as corrupt, or gone
			errs[i] = fmt.Errorf("%w: read %s: %v (%d bytes)", ErrPromote, p.key.Hash, err, ns[j])
			continue
		}
		if c.ioHook != nil {
			c.ioHook("read", p.key)
		}
		// Commit under mu: a Delete marks the promotions in flight, and
		// those registered while it runs, before it deletes, so either it
		// finds the block committed or the mark is seen here.
		c.mu.Lock()
		if p.deleted {
			c.mu.Unlock()
			c.Host.Abort(hd)
			c.promoteLost.Add(1)
			errs[i] = fmt.Errorf("%w: %s was deleted while it was read", ErrPromote, p.key.Hash)
			continue
		}
		err := c.Host.CommitPinned(hd)
		info := p.info
		c.mu.Unlock()
		if err != nil {
			errs[i] = fmt.Errorf("%w: %v", ErrPromote, err)
			continue
		}
		held[i] = hd // pinned until finish has leased it to every waiter
		c.note(polEvent{op: polPromoted, k: pk(p.key), a: info})
		c.promoted.Add(1)
		c.promotedBytes.Add(uint64(p.size))
		c.swapInNanos.Add(uint64(dt))
		if c.cfg.ObserveSwapIn != nil {
			c.cfg.ObserveSwapIn(dt)
		}
	}
	c.kickDemoter()
	return errs, held
}

// finish hands the promoted block to every waiter as a lease.
func (c *Chain) finish(p *promotion, err error) {
	c.mu.Lock()
	if c.inflight[p.key] == p {
		delete(c.inflight, p.key)
	}
	ws, late := p.waiters, p.late
	p.waiters, p.late = nil, nil // each waiter is called once, even if p is finished twice
	c.mu.Unlock()
	for _, w := range late {
		c.promote(p.key, p.size, w) // a miss if the block is gone again
	}
	for _, w := range ws {
		if w == nil {
			continue // an acquire whose caller does not want the lease
		}
		if err != nil {
			w(nil, err)
			continue
		}
		if hd, ok := c.Host.Pin(p.key); ok {
			w(hd, nil)
		} else {
			w(nil, fmt.Errorf("%w: %s left the host tier before it was leased", ErrPromote, p.key.Hash))
		}
	}
}

// Committed tells the chain a block was added to the host tier.
func (c *Chain) Committed() {
	if c.NVMe == nil {
		return
	}
	used, capacity := c.Host.Occupied()
	if high, _ := c.Watermarks(); above(used, capacity, high) {
		c.kickDemoter()
	}
}

// above reports whether a tier with used of capacity bytes is above the
// high watermark high: past it, or full (with a high watermark of 1 it can
// never be past it, and a full tier must still go down to the low one).
func above(used, capacity int64, high float64) bool {
	return float64(used) > high*float64(capacity) || used >= capacity
}

func (c *Chain) kickDemoter() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// demoteLoop keeps the host tier under its high watermark by moving its
// coldest blocks to NVMe.
func (c *Chain) demoteLoop(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-t.C:
		}
		used, capacity := c.Host.Occupied()
		high, low := c.Watermarks()
		if !above(used, capacity, high) {
			continue
		}
		// The lock is taken per batch, not per pass: a promotion making
		// room (makeRoom) waits for one batch, not for a pass from the high
		// watermark to the low one (10% of the tier).
		for float64(used) > low*float64(capacity) && ctx.Err() == nil {
			c.demoteMu.Lock()
			moved := c.demoteBatch(demoteBatchBlocks)
			c.demoteMu.Unlock()
			if moved == 0 {
				break
			}
			used, _ = c.Host.Occupied()
		}
	}
}

// demoteBatchBlocks is the demoter's batch: the most blocks one pass
// pins and hands its writers (runs of writeRun) at once.
const demoteBatchBlocks = 16

// makeRoom demotes until n more bytes, for blocks blocks, fit under the
// high watermark, and the blocks of sizes (if given) can be placed without
// an eviction. Each round demotes as many blocks as are coming in
// (between 4 and demoteBatchBlocks): a run of promotions makes its room
// with one batch of writes rather than one small batch per 4 blocks, and
// a single block still waits for no more than 4 to go down.
func (c *Chain) makeRoom(n int64, blocks int, sizes ...int64) {
	// Under the watermark is not always room: with several block sizes the
	// free bytes may be free slots of other classes' slabs, no slab free
	// and none compactable, and the reservation would evict a block that
	// has no copy below.
	room := func() bool { return c.fits(n) && (len(sizes) == 0 || c.Host.Placeable(sizes)) }
	// Where they fit already, the promotion goes ahead without the lock,
	// instead of waiting for the demoter's batch in progress (the watermark
	// is a target, not a limit: concurrent promotions may pass it by a few
	// blocks, and the demoter brings the tier back).
	if room() {
		return
	}
	c.demoteMu.Lock()
	defer c.demoteMu.Unlock()
	batch := min(max(blocks, 4), demoteBatchBlocks)
	for !room() && c.demoteBatch(batch) > 0 {
	}
}

// fits reports whether n more bytes fit in the host tier under its high
// watermark.
func (c *Chain) fits(n int64) bool {
	used, capacity := c.Host.Occupied()
	high, _ := c.Watermarks()
	return float64(used+n) <= high*float64(capacity)
}

// monoClock is the origin of monoNow.
var monoClock = time.Now()

// monoNow is nanoseconds on the monotonic clock (since monoClock).
func monoNow() int64 { return int64(time.Since(monoClock)) }

// demoteBatch moves up to n of the coldest host blocks down and returns how
// many left the host tier.
func (c *Chain) demoteBatch(n int) int {
	if monoNow() < c.diskFullUntil.Load() {
		return 0
	}
	hs, drop, pv := c.pinVictims(n)
	moved := 0
	for _, hd := range hs[:drop] {
		if dropped, _ := c.Host.Unpin(hd, true); dropped {
			moved++
			c.refusedDrops.Add(1)
		} else if c.Host.Contains(hd.Key) {
			c.Inserted(hd.Key, policy.AccessInfo{}) // leased meanwhile: ask again
		}
	}
	var demoted atomic.Int64
	// Victims that stay (and those a reader held leased) are handed back
	// to the policy after the writes, parents first (handBackAll).
	var backMu sync.Mutex
	back := map[policy.Key]bool{}
	for _, k := range pv.leased {
		back[k] = true
	}
	stays := func(hd *Handle) {
		backMu.Lock()
		back[pk(hd.Key)] = true
		backMu.Unlock()
	}
	defer func() { c.handBackAll(pv, back) }()
	eachWriter(hs[drop:], func(run []*Handle) {
		var ok []bool
		var took []time.Duration
		if monoNow() < c.diskFullUntil.Load() {
			ok = make([]bool, len(run))
		} else {
			ok, _, took, _ = c.writeDown(run)
		}
		for i, hd := range run {
			if !ok[i] && c.tooLarge(hd) {
				// No tier below holds it: the host is its last tier.
				if dropped, _ := c.Host.Unpin(hd, true); dropped {
					demoted.Add(1) // left the host tier
					c.oversizeDrops.Add(1)
				} else if c.Host.Contains(hd.Key) {
					stays(hd) // leased meanwhile
				}
				continue
			}
			if !ok[i] {
				c.Host.Unpin(hd, false)
				stays(hd) // still resident: track it again
				continue
			}
			if dropped, _ := c.Host.Unpin(hd, true); dropped {
				demoted.Add(1)
				c.demoted.Add(1)
				c.demotedBytes.Add(uint64(hd.Size))
				c.swapOutNanos.Add(uint64(took[i]))
			} else if c.Host.Contains(hd.Key) {
				// Leased meanwhile: it stays, so the policy must track it again.
				stays(hd)
			}
		}
	})
	return moved + int(demoted.Load())
}

// demoteWriters bounds the NVMe writes a demotion pass has in flight. The
// store's Put is safe for concurrent use, and one writer leaves the disk
// idle while it hashes and indexes: 64 KiB blocks went in at 397 MB/s from
// one goroutine and 821 MB/s from two on the 2-core development VM, but at
// 665 and 543 MB/s from four and eight, which contend for the CPU (go test
// ./tiers/nvme -run TestRawVsStore -nvme.rawbench -nvme.rawbench.kib 64
// -nvme.rawbench.streams 1,2,4,8; docs/benchmarks.md). Hence one writer
// per CPU, up to four.
func demoteWriters() int { return min(4, runtime.GOMAXPROCS(0)) }

// writeRun is the most handles one writer hands the store at once
// (nvme.PutBatch): store puts of 64 KiB blocks went in at 1,387 MB/s from
// one goroutine in runs of 16, 490 MB/s one at a time (docs/benchmarks.md,
// "Batched NVMe writes").
const writeRun = 16

// eachWriter hands hs to write in runs of at most writeRun, on up to
// demoteWriters goroutines (at least one run per writer when there are
// fewer handles than writers × writeRun), and returns when all have run.
func eachWriter(hs []*Handle, write func(run []*Handle)) {
	writers := min(demoteWriters(), len(hs))
	if writers == 0 {
		return
	}
	size := int64(min(writeRun, (len(hs)+writers-1)/writers))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(size) - size; i < int64(len(hs)); i = next.Add(size) - size {
				write(hs[i:min(i+size, int64(len(hs)))])
			}
		}()
	}
	wg.Wait()
}

// tooLarge reports whether hd is larger than the NVMe tier's largest
// block (segments are sized from its capacity): no tier below can hold it.
func (c *Chain) tooLarge(hd *Handle) bool { return hd.Size > c.NVMe.MaxBlockBytes() }

// writeDown makes sure NVMe holds a copy of each pinned block of run, with
// one batched store call for those it lacks, and reports which do, how
// many it wrote, and the copy time of each (its batch's time for a block
// written now, 0 for a clean copy already below or one deleted meanwhile,
// which is left out and not counted). A block too large for
// NVMe is not ok (and does not fail the rest of the batch). The caller
// charges a block's copy time to swapOutNanos when it counts the block as
// moved: a flush's copies move nothing. err, a *writeFailure, says how
// many blocks the store failed to write; those it stored before count in
// wrote, but are not ok.
func (c *Chain) writeDown(run []*Handle) (ok []bool, wrote int, took []time.Duration, err error) {
	ok = make([]bool, len(run))
	took = make([]time.Duration, len(run))
	var keys []nvme.Key
	var blocks [][]byte
	var idx []int
	for i, hd := range run {
		if c.inNVMe(hd.Key) {
			ok[i] = true // clean copy already below
			continue
		}
		if c.tooLarge(hd) {
			continue
		}
		keys, blocks, idx = append(keys, nk(hd.Key)), append(blocks, c.Host.Bytes(hd)), append(idx, i)
	}
	if len(keys) == 0 {
		return ok, 0, took, nil
	}
	t0 := time.Now()
	if c.ioHook != nil {
		for _, i := range idx {
			c.ioHook("put", run[i].Key)
		}
	}
	// A block deleted meanwhile is left out, checked under the store's lock
	// on its key (Chain.delete's NVMe step waits for a block kept before
	// its host step). Stored and removed after the batch, it was visible in
	// between, after its Delete returned (a Lookup hit, a put refused as a
	// duplicate), and the removal took with it a newer generation that
	// another writer stored meanwhile.
	// Those left out are not counted as written (Flush reports the count).
	left := make([]bool, len(keys))
	keep := func(j int) bool {
		left[j] = c.Host.Deleted(run[idx[j]])
		return !left[j]
	}
	done, err := c.NVMe.PutBatchIf(keys, blocks, keep)
	if err != nil {
		// The chunks before the one that failed are stored (keys[:done]):
		// counted as written (Flush reports them), yet not ok, as the rest
		// of the batch: they stay in the host tier and find their clean
		// copy at the next attempt.
		for j := range done {
			if !left[j] {
				wrote++
			}
		}
		failed := len(keys) - done
		c.demoteErrors.Add(uint64(failed)) // blocks, like the moves
		if errors.Is(err, nvme.ErrNoSpace) {
			c.diskFullUntil.Store(monoNow() + int64(time.Second))
		}
		c.log.Warn("demotion to nvme failed", "blocks", failed, "first", run[idx[done]].Key.Hash, "err", err)
		return ok, wrote, took, &writeFailure{blocks: failed, err: err}
	}
	dt := time.Since(t0)
	for j, i := range idx {
		ok[i] = true // deleted meanwhile: nothing to keep in the host tier either
		if left[j] {
			continue
		}
		wrote++
		took[i] = dt
		if c.cfg.ObserveSwapOut != nil {
			c.cfg.ObserveSwapOut(dt) // each block of the batch waited for all of it
		}
	}
	return ok, wrote, took, nil
}

// writeFailure is writeDown's error: the store failed to write blocks of
// the batch.
type writeFailure struct {
	blocks int
	err    error
}

func (e *writeFailure) Error() string {
	return fmt.Sprintf("%d blocks not written to nvme: %v", e.blocks, e.err)
}

func (e *writeFailure) Unwrap() error { return e.err }

// Flush writes every host block that has no copy in NVMe down to NVMe (the
// host tier keeps its copies). It returns how many blocks it wrote, and an
// error if ctx ended first or any write failed (saying how many, wrapping
// the first failure): a flush that wrote nothing because the store failed
// is not a flush with nothing to write.
//
// It writes oldest first, one run after another: NVMe orders its blocks
// by write order after a restart, so the host tier's recency carries over
// (parallel writers would interleave their runs). A flush goes at one
// writer's speed, which for batched runs is two writers' (1,387 vs 1,365
// MB/s at 64 KiB, docs/benchmarks.md, "Batched NVMe writes"); a flush cut
// short leaves the most recently used blocks unwritten.
func (c *Chain) Flush(ctx context.Context) (int, error) {
	return c.flush(ctx, nil)
}

// FlushParked is Flush of the parked blocks only. A stop without a
// write-down of the host tier (nvme.flush_on_stop off) runs it after Wait:
// blocks still queued for their write-through when the chain stopped, or
// held for a retry, are left in the host tier, which does not outlive the
// process, and parked requests are promised to survive.
func (c *Chain) FlushParked(ctx context.Context) (int, error) {
	return c.flush(ctx, c.isParked)
}

// flush is Flush of the blocks only selects (all if nil).
func (c *Chain) flush(ctx context.Context, only func(Key) bool) (int, error) {
	if c.NVMe == nil {
		return 0, nil
	}
	hs := c.Host.PinAllOldestFirst()
	if only != nil {
		sel := hs[:0]
		for _, hd := range hs {
			if only(hd.Key) {
				sel = append(sel, hd)
			} else {
				c.Host.Unpin(hd, false)
			}
		}
		hs = sel
	} else {
		// Parked blocks still in the host tier first: they are promised
		// to survive, and a flush cut short (the stop's budget) leaves its
		// tail unwritten. Their place in NVMe's recency order does not
		// matter: it never evicts them.
		var parked, rest []*Handle
		for _, hd := range hs {
			if c.isParked(hd.Key) {
				parked = append(parked, hd)
			} else {
				rest = append(rest, hd)
			}
		}
		hs = append(parked, rest...)
	}
	n, failed := 0, 0
	var err, werr error
	for len(hs) > 0 {
		run := hs[:min(writeRun, len(hs))]
		if err == nil {
			if err = ctx.Err(); err == nil { // once cut, the rest stays unwritten
				_, wrote, _, e := c.writeDown(run)
				n += wrote
				var wf *writeFailure
				if errors.As(e, &wf) {
					failed += wf.blocks
					if werr == nil {
						werr = wf.err
					}
				}
			}
		}
		for _, hd := range run { // each run as it is done: a long flush keeps the tier evictable
			c.Host.Unpin(hd, false)
		}
		hs = hs[len(run):]
	}
	if werr != nil {
		werr = fmt.Errorf("%d of %d blocks not written to nvme: %w", failed, n+failed, werr)
	}
	return n, errors.Join(werr, err)
}

// Park is called after a parked block was committed to the host tier: it
// is pinned there until written through to NVMe, then leaves the host tier
// (a parked request is swapped out). Without an NVMe tier it stays in the
// host tier like any block.
func (c *Chain) Park(k Key) {
	c.parkMu.Lock()
	c.parked[k] = time.Now().Add(c.cfg.ParkTTL)
	if exp, ok := c.parkPrior[k]; ok {
		// Before Start: a warm restart re-parks the blocks the previous
		// process left in the host arena, with the expiry it stored.
		c.parked[k] = exp
		delete(c.parkPrior, k)
	}
	c.parkMu.Unlock()
	if c.NVMe == nil {
		// Evicted since its commit (before it was recorded here, so its
		// removal did not forget it): no tier holds it.
		c.forgetParkedIfGone(k)
		return
	}
	c.mu.Lock() // against Wait: a queued block is written or unpinned
	defer c.mu.Unlock()
	if c.stopped {
		return // it stays in the host tier, which Flush writes down
	}
	hd, ok := c.Host.Pin(k)
	if !ok {
		c.forgetParkedIfGone(k) // evicted since its commit, as above
		return
	}
	select {
	case c.parkCh <- hd:
	default:
		if !c.parkLive {
			c.parkEarly = append(c.parkEarly, hd)
			return
		}
		c.handoffs.Add(1) // bounded by the sessions' rings
		go func() {
			defer c.handoffs.Done()
			select {
			case c.parkCh <- hd:
			case <-c.stopCh:
				c.Host.Unpin(hd, false)
			}
		}()
	}
}

func (c *Chain) isParked(k Key) bool {
	c.parkMu.Lock()
	defer c.parkMu.Unlock()
	_, ok := c.parked[k]
	return ok
}

// parkLoop writes parked blocks through to NVMe, where the budget never
// evicts them (see nvme.Options.Unevictable), and drops their host copy.
// A parked request arrives as a burst of blocks: each writer takes its
// share of those already queued, up to writeRun, and writes them as one
// batch, so the other writers are not left idle.
func (c *Chain) parkLoop(ctx context.Context) {
	run := make([]*Handle, 0, writeRun)
	for {
		select {
		case <-ctx.Done():
			return
		case hd := <-c.parkCh:
			run = append(run[:0], hd)
		}
		share := min(writeRun, 1+len(c.parkCh)/demoteWriters())
	more:
		for len(run) < share {
			select {
			case hd := <-c.parkCh:
				run = append(run, hd)
			default:
				break more
			}
		}
		c.writeThrough(run, true)
	}
}

// parkHoldShare: at most 1/parkHoldShare of the host tier holds parked
// blocks pinned after their write-through failed; the rest of the tier
// stays for live traffic however many parks fail.
const parkHoldShare = 2

// writeThrough writes pinned parked blocks down to NVMe and drops their
// host copies. Blocks resumed or released meanwhile are unpinned; blocks
// that could not be written stay pinned for the next retry (counted as
// park errors on their first attempt) while they fit in the host tier's
// share for them (parkHoldShare), and are left evictable beyond it. It
// reports whether any block of run could not be written.
func (c *Chain) writeThrough(run []*Handle, first bool) (failed bool) {
	live := run[:0]
	for _, hd := range run {
		// The handle, not just the key: a request released and parked
		// again under the same id has a new handle of its own.
		if c.isParked(hd.Key) && !c.Host.Deleted(hd) {
			live = append(live, hd)
		} else {
			c.Host.Unpin(hd, false) // resumed or released meanwhile
		}
	}
	written, _, took, _ := c.writeDown(live)
	limit, released := int64(-1), 0
	for i, ok := range written {
		hd := live[i]
		if !ok {
			failed = true
			if first {
				c.parkErrors.Add(1)
			}
			if limit < 0 {
				limit = c.Host.Stats().CapacityBytes / parkHoldShare
			}
			c.parkMu.Lock()
			hold := c.parkRetryBytes+hd.Size <= limit
			if hold {
				c.parkRetry = append(c.parkRetry, hd)
				c.parkRetryBytes += hd.Size
			}
			c.parkMu.Unlock()
			if !hold {
				// Past the share: unpinned, kept while the host tier has
				// room for it, and written down later (parkLater).
				c.Host.Unpin(hd, false)
				c.parkMu.Lock()
				c.parkLater = append(c.parkLater, hd)
				c.parkMu.Unlock()
				released++
			}
			continue
		}
		// Released while we wrote: writeDown left it out if the release
		// came first, and the release's own NVMe step removes it if not.
		if dropped, _ := c.Host.Unpin(hd, true); dropped {
			c.demoted.Add(1)
			c.demotedBytes.Add(uint64(hd.Size))
			c.swapOutNanos.Add(uint64(took[i]))
		} else if c.Host.Copied(hd) {
			// Held by a reader (a resume, a flush): it stays, now a clean
			// copy of NVMe's, no longer counted against ParkedShare, and
			// the policy's to demote (a drop) like a promoted copy.
			c.Inserted(hd.Key, policy.AccessInfo{})
		}
	}
	if released > 0 {
		c.log.Warn("parked blocks could not be written to nvme and exceed the host tier's share held for them; they may be dropped for space",
			"blocks", released, "share", fmt.Sprintf("1/%d", parkHoldShare))
	}
	return failed
}

// expireLoop deletes parked requests whose TTL passed.
func (c *Chain) expireLoop(ctx context.Context) {
	period := min(c.cfg.ParkTTL/10, time.Second)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			var dead []Key
			c.parkMu.Lock()
			for k, exp := range c.parked {
				if now.After(exp) {
					dead = append(dead, k)
				}
			}
			c.parkMu.Unlock()
			expired := 0
			for _, k := range dead {
				if c.expireHook != nil {
					c.expireHook(k)
				}
				if c.expire(k, now) {
					expired++
				}
			}
			if expired > 0 {
				c.log.Info("parked blocks expired", "blocks", expired, "ttl", c.cfg.ParkTTL)
			}
			// The blocks held for a retry stay counted in parkRetryBytes
			// until each is retried: write-throughs failing meanwhile are
			// held against the whole share.
			c.parkMu.Lock()
			retry := c.parkRetry
			c.parkRetry = nil
			c.parkMu.Unlock()
			failed := false
			for len(retry) > 0 && !failed {
				n := min(len(retry), writeRun)
				var b int64
				for _, hd := range retry[:n] {
					b += hd.Size
				}
				c.parkMu.Lock()
				c.parkRetryBytes -= b // writeThrough counts those it holds again
				c.parkMu.Unlock()
				failed = c.writeThrough(retry[:n], false)
				retry = retry[n:]
				if failed && len(retry) > 0 {
					// Still no room (or failing): the rest waits for the
					// next tick, ahead of the blocks that just failed.
					c.parkMu.Lock()
					c.parkRetry = append(slices.Clone(retry), c.parkRetry...)
					c.parkMu.Unlock()
				}
			}
			if !failed {
				c.writeLater()
			} else {
				c.pruneLater()
			}
		}
	}
}

// writeLater writes down the parked blocks unpinned past the hold share
// (parkLater) that are still parked and in the host tier, in runs, until
// one fails: the rest waits for the next tick.
func (c *Chain) writeLater() {
	c.parkMu.Lock()
	later := c.parkLater
	c.parkLater = nil
	c.parkMu.Unlock()
	for len(later) > 0 {
		n := min(len(later), writeRun)
		var run []*Handle
		for _, hd := range later[:n] {
			if c.isParked(hd.Key) && c.Host.PinHandle(hd) {
				run = append(run, hd)
			}
		}
		later = later[n:]
		if len(run) > 0 && c.writeThrough(run, false) && len(later) > 0 {
			c.parkMu.Lock()
			c.parkLater = append(slices.Clone(later), c.parkLater...)
			c.parkMu.Unlock()
			return
		}
	}
}

// pruneLater drops from parkLater the blocks no longer parked in the host
// tier (evicted, released, expired), so that it does not grow while the
// disk stays full.
func (c *Chain) pruneLater() {
	c.parkMu.Lock()
	later := c.parkLater
	c.parkLater = nil
	c.parkMu.Unlock()
	keep := later[:0]
	for _, hd := range later {
		if c.isParked(hd.Key) && c.Host.Holds(hd) {
			keep = append(keep, hd)
		}
	}
	clear(later[len(keep):])
	c.parkMu.Lock()
	c.parkLater = append(keep, c.parkLater...)
	c.parkMu.Unlock()
}

// expire deletes the parked block k if its TTL passed at now, and reports
// whether it did. The block may have been resumed or released since
// expireLoop saw it expired, and parked again under the same id (a fresh
// TTL): the check and the delete are one step against Delete.
func (c *Chain) expire(k Key, now time.Time) bool {
	c.parkDelMu.Lock()
	defer c.parkDelMu.Unlock()
	c.parkMu.Lock()
	exp, ok := c.parked[k]
	c.parkMu.Unlock()
	if !ok || !now.After(exp) {
		return false
	}
	c.delete(k)
	c.parkExpired.Add(1)
	return true
}

// forgetParkedIfGone drops k from the parked blocks when no tier holds it
// any more (NVMe dropped it as corrupt when a resume read it, a Delete's
// NVMe step deleted a block parked after its host step). The check and
// the drop are one step under the host tier's lock, as in the removal
// callback (NewChain): a block of k committed after the check is recorded
// by its own Park, after the drop, and one committed before it is seen;
// NVMe gets k only from a host copy, which the check would have seen.
func (c *Chain) forgetParkedIfGone(k Key) {
	if !k.Parked() {
		return
	}
	c.Host.ifAbsent(k, func() {
		if !c.inNVMe(k) {
			c.parkMu.Lock() // parkMu is never held while taking the host's lock
			delete(c.parked, k)
			c.parkMu.Unlock()
		}
	})
}

// ParkedBlocks returns how many parked blocks the chain holds.
func (c *Chain) ParkedBlocks() int {
	c.parkMu.Lock()
	defer c.parkMu.Unlock()
	return len(c.parked)
}

// Delete removes key from every tier.
func (c *Chain) Delete(k Key) bool {
	if k.Parked() {
		c.parkDelMu.Lock() // against expire
		defer c.parkDelMu.Unlock()
	}
	return c.delete(k)
}

func (c *Chain) delete(k Key) bool {
	if k.Parked() {
		c.parkMu.Lock()
		delete(c.parked, k)
		delete(c.parkPrior, k) // before Start: not stored again by Wait
		c.parkMu.Unlock()
	}
	c.mu.Lock()
	if p := c.inflight[k]; p != nil {
		p.deleted = true // its read may predate the delete below
	}
	c.deleting[k]++ // and so may the read of one registered meanwhile
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.deleting[k]--; c.deleting[k] == 0 {
			delete(c.deleting, k)
		}
		c.mu.Unlock()
	}()
	found := c.Host.Delete(k)
	if c.deleteHook != nil {
		c.deleteHook(k)
	}
	if c.NVMe != nil {
		// Unconditionally: a write-down that kept the block (PutBatchIf)
		// before the host step above may not have indexed it yet; it
		// holds the key's lock, which Delete waits for.
		if c.inNVMe(k) {
			found = true
		}
		c.NVMe.Delete(nk(k))
	}
	// A block of k committed and parked after the parked set was cleared
	// above, written through to NVMe and dropped from the host tier before
	// the NVMe step, was just deleted there: Park recorded it again, and
	// its removal from the host tier kept it (NVMe held it then).
	c.forgetParkedIfGone(k)
	return found
}

// beingDeletedLocked reports whether a Delete or DeleteNS of k is in
// progress. mu held.
func (c *Chain) beingDeletedLocked(k Key) bool {
	return c.deleting[k] > 0 || c.deletingNS[k.NS] > 0
}

// Namespaces calls fn with the namespace of every block the chain holds
// or is moving: promotions in flight, parked blocks (their namespace
// carries ParkedNS), the host tier, then NVMe, at least once each. Host
// before NVMe: a block demoted meanwhile is written down before it leaves
// the host tier, so one of the two walks sees it. fn runs under the
// tiers' locks and must not call them.
func (c *Chain) Namespaces(fn func(ns uint32)) {
	c.mu.Lock()
	for k := range c.inflight {
		fn(k.NS)
	}
	c.mu.Unlock()
	c.parkMu.Lock()
	for k := range c.parked {
		fn(k.NS)
	}
	for k := range c.parkPrior {
		fn(k.NS)
	}
	c.parkMu.Unlock()
	c.Host.Namespaces(fn)
	if c.NVMe != nil {
		c.NVMe.Namespaces(fn)
	}
}

// DeleteNS removes namespace ns from every tier and returns the number of
// distinct blocks removed.
func (c *Chain) DeleteNS(ns uint32) int {
	return c.DeleteNamespaces(map[uint32]struct{}{ns: {}})
}

// DeleteNamespaces is DeleteNS of every namespace in nss, in one pass over
// each tier: a DeleteNS per namespace walks the NVMe index once each, and
// an evict of everything names every registered namespace (up to 65,536).
func (c *Chain) DeleteNamespaces(nss map[uint32]struct{}) int {
	in := func(ns uint32) bool { _, ok := nss[ns]; return ok }
	parked := false
	for ns := range nss {
		if ns&ParkedNS != 0 {
			parked = true
			break
		}
	}
	if parked {
		c.parkMu.Lock()
		for k := range c.parked {
			if in(k.NS) {
				delete(c.parked, k)
			}
		}
		for k := range c.parkPrior {
			if in(k.NS) {
				delete(c.parkPrior, k)
			}
		}
		c.parkMu.Unlock()
	}
	c.mu.Lock()
	for k, p := range c.inflight {
		if in(k.NS) {
			p.deleted = true
		}
	}
	for ns := range nss {
		c.deletingNS[ns]++
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		for ns := range nss {
			if c.deletingNS[ns]--; c.deletingNS[ns] == 0 {
				delete(c.deletingNS, ns)
			}
		}
		c.mu.Unlock()
	}()
	// Distinct blocks: a host block with a clean copy in NVMe counts once.
	both, n := 0, 0
	for ns := range nss {
		n += c.Host.deleteNS(ns, func(k Key) {
			if c.inNVMe(k) {
				both++
			}
		})
	}
	if c.deleteHook != nil {
		for ns := range nss {
			c.deleteHook(Key{NS: ns})
		}
	}
	if c.NVMe != nil {
		m, _ := c.NVMe.DeleteNamespaces(nss)
		n += max(m-both, 0)
	}
	if parked {
		// Blocks parked since the set was cleared above (as in delete):
		// those the NVMe step deleted are gone.
		var again []Key
		c.parkMu.Lock()
		for k := range c.parked {
			if in(k.NS) {
				again = append(again, k)
			}
		}
		c.parkMu.Unlock()
		for _, k := range again {
			c.forgetParkedIfGone(k)
		}
	}
	return n
}

// ChainStats counts movement between tiers.
type ChainStats struct {
	NVMeHits, NVMeMisses        uint64
	Demoted, DemotedBytes       uint64 // host → nvme
	Promoted, PromotedBytes     uint64 // nvme → host
	DemoteErrors, PromoteErrors uint64 // blocks whose write down (any: demotion, park, flush) or promotion failed
	Prefetches, PrefetchDropped uint64
	ParkedBlocks                int
	ParkErrors, ParkExpired     uint64
	ParkRefused                 uint64        // parked reservations refused: the parked blocks' share of NVMe is full
	ParkedNVMeBytes             int64         // bytes of parked blocks on NVMe
	PromoteLost                 uint64        // evicted from NVMe before the promotion read it
	RefusedDrops                uint64        // host blocks the policy did not admit, dropped to make room
	OversizeDrops               uint64        // host blocks too large for NVMe, dropped to make room
	SwapIn, SwapOut             time.Duration // time spent copying the blocks counted in Promoted, Demoted
	PolicyEventDrops            uint64        // policy events dropped on a full queue
}

// Stats returns the movement counters.
func (c *Chain) Stats() ChainStats {
	return ChainStats{
		NVMeHits: c.nvmeHits.Load(), NVMeMisses: c.nvmeMisses.Load(),
		Demoted: c.demoted.Load(), DemotedBytes: c.demotedBytes.Load(),
		Promoted: c.promoted.Load(), PromotedBytes: c.promotedBytes.Load(),
		DemoteErrors: c.demoteErrors.Load(), PromoteErrors: c.promoteErrs.Load(), PromoteLost: c.promoteLost.Load(),
		RefusedDrops: c.refusedDrops.Load(), OversizeDrops: c.oversizeDrops.Load(),
		Prefetches: c.prefetches.Load(), PrefetchDropped: c.prefetchDrops.Load(),
		ParkedBlocks: c.ParkedBlocks(), ParkErrors: c.parkErrors.Load(), ParkExpired: c.parkExpired.Load(), ParkRefused: c.parkRefused.Load(),
		SwapIn: time.Duration(c.swapInNanos.Load()), SwapOut: time.Duration(c.swapOutNanos.Load()),
		PolicyEventDrops: c.polDrops.Load(), ParkedNVMeBytes: c.parkedNVMeBytes(),
	}
}

func (c *Chain) parkedNVMeBytes() int64 {
	if c.NVMe == nil {
		return 0
	}
	return c.NVMe.UnevictableBytes()
}
