package daemon

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
)

// NamespaceSpec is the wire type: the wire format (and its Validate, which
// names the offending field) lives in one place, shm, and the registry keys
// on the exact struct, so two engines share ids only if every field matches.
type NamespaceSpec = shm.Namespace

// maxNamespaces bounds the registry; real hosts have a handful of models x
// TP ranks. A full registry reclaims idle namespaces (see Registry).
const maxNamespaces = 1 << 16

// reclaimGrace is how long a namespace must have gone without a Register
// before a full registry may reclaim it. It covers the window between
// Register returning an id and the session being listed (a handshake,
// bounded by seconds), which the daemon's check cannot see.
const reclaimGrace = 10 * time.Minute

// reclaimEvery spaces the reclaim passes of a full registry: each walks
// every tier's index (O(blocks)) and rewrites the snapshot, and a peer
// naming new namespaces at will must not make it do so at will.
const reclaimEvery = 10 * time.Second

// reclaiming marks, in Registry.used, an id a reclaim is taking out.
const reclaiming = math.MinInt64

// minJournalReserve is the fewest ids a compaction sets aside for the
// journal (see Registry).
const minJournalReserve = 64

// maxNamespaceID is the largest namespace id: the tier chain marks parked
// blocks by setting tiers.ParkedNS in their namespace, so an id with that
// bit would make a model's blocks look parked (never evicted from NVMe).
const maxNamespaceID = tiers.ParkedNS - 1

const (
	registryFile    = "namespaces.json"
	registryVersion = 1
	journalFile     = "namespaces.journal"
	journalVersion  = 1
)

// registryDoc is the on-disk form. NextID is stored rather than recomputed
// so that an id is never handed out twice even if entries are ever removed.
type registryDoc struct {
	Version    int              `json:"version"`
	Epoch      uint64           `json:"epoch"`
	NextID     uint32           `json:"next_id"`
	Namespaces []registryRecord `json:"namespaces"`
}

type registryRecord struct {
	ID   uint32        `json:"id"`
	Spec NamespaceSpec `json:"spec"`
}

// journalHeader is the journal's first line: it extends only the snapshot
// of that epoch and next_id whose ids are all below first_id.
type journalHeader struct {
	Version int    `json:"version"`
	Epoch   uint64 `json:"epoch"`
	NextID  uint32 `json:"next_id"`
	FirstID uint32 `json:"first_id"`
}

// Registry hands out stable namespace ids (starting at 1; 0 means "none")
// and persists them in <StateDir>/namespaces.json. It is safe for
// concurrent use; lookups never wait for a Register's fsync.
//
// A new namespace is appended to <StateDir>/namespaces.journal, one JSON
// line fsynced, rather than rewriting the snapshot (namespaces.json): a
// peer names namespaces at will, and rewriting the whole file for each cost
// O(n²) bytes for n of them. The snapshot is rewritten (compacted) when
// the journal's ids run out, with room for as many again, so each costs
// O(1) bytes amortized. The snapshot's next_id is the end of the ids set
// aside for the journal: a kvtierd that knows no journal reads a valid
// registry that never hands out an id the journal may have used.
//
// The registry holds at most maxNamespaces. Any allowed process can name
// that many (random model ids, a buggy engine), so a Register that finds it
// full reclaims the namespaces that are idle: not registered for
// reclaimGrace, and with no session and no block in any tier, as the
// daemon's inUse check says (setReclaim). It reclaims all of them in one
// pass, at most one pass per reclaimEvery, and compacts the snapshot
// without them; if none is idle the new namespace is refused. Ids are
// never reused (nextID only grows, and the id space is 32,768 times
// maxNamespaces), so anything still naming a reclaimed id (a block that
// raced the check) can never name another model: it is never served, and
// the reclaim deletes it from every tier once the new id is registered
// (setReclaim's dropped). A reclaimed spec that comes back gets a new id.
type Registry struct {
	path  string
	jpath string
	epoch uint64
	isNew bool // this Open started the epoch (no file, or a discarded one)

	wmu sync.Mutex // serializes writers; held across the file write
	// reserveEnd is the snapshot's next_id: ids in [nextID, reserveEnd)
	// go to the journal, when journalOK (it is bound to the snapshot and
	// ends with a whole line). Both under wmu.
	reserveEnd uint32
	journalOK  bool

	mu     sync.RWMutex // guards the maps and nextID; writers also hold wmu
	byID   map[uint32]NamespaceSpec
	bySpec map[NamespaceSpec]uint32
	nextID uint32

	// used (the map under mu, as byID) holds each id's last Register, in
	// nanoseconds since t0 on the now clock, or reclaiming while a reclaim
	// takes the id out: a Register of the spec that sees reclaiming waits
	// for the reclaim (wmu) rather than return an id it is reclaiming, and
	// a reclaim skips an id whose stamp moved since it looked (CAS).
	used map[uint32]*atomic.Int64
	t0   time.Time

	// Reclaim (under wmu): inUse removes from ids every namespace in use;
	// nil (a registry without a daemon) never reclaims. dropped, after
	// each reclaim, deletes whatever the tiers still hold under the ids
	// taken out. nextReclaim is the stamp before which no reclaim pass
	// runs again.
	inUse        func(ids map[uint32]struct{})
	dropped      func(ids []uint32)
	log          *slog.Logger
	nextReclaim  int64
	grace, every time.Duration // reclaimGrace, reclaimEvery; tests change them
	reclaimed    atomic.Uint64 // namespaces reclaimed since Open

	limit int              // maxNamespaces; tests lower it
	now   func() time.Time // time.Now; tests move it on
}

// OpenRegistry loads (or starts) the registry in stateDir, creating the
// directory with mode 0750 if needed. A corrupt file is moved aside to
// namespaces.json.corrupt-<unix> and the registry starts empty with a new
// Epoch, logged as a warning. Other read errors, and a file from a newer
// version, are returned rather than risk discarding ids.
func OpenRegistry(stateDir string) (*Registry, error) {
	if err := os.MkdirAll(stateDir, 0o750); err != nil {
		return nil, fmt.Errorf("namespace registry: %w", err)
	}
	r := &Registry{
		path:   filepath.Join(stateDir, registryFile),
		jpath:  filepath.Join(stateDir, journalFile),
		byID:   map[uint32]NamespaceSpec{},
		bySpec: map[NamespaceSpec]uint32{},
		nextID: 1,
		used:   map[uint32]*atomic.Int64{},
		t0:     time.Now(),
		log:    slog.Default(),
		// The first pass runs whenever the registry is first full.
		nextReclaim: math.MinInt64,
		grace:       reclaimGrace,
		every:       reclaimEvery,
		limit:       maxNamespaces,
		now:         time.Now,
	}
	// Temp files left by a crash between create and rename are garbage.
	for _, p := range []string{r.path, r.jpath} {
		stale, _ := filepath.Glob(p + ".tmp-*")
		for _, p := range stale {
			_ = os.Remove(p)
		}
	}
	data, err := os.ReadFile(r.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return r.fresh()
	case err != nil:
		return nil, fmt.Errorf("namespace registry: %w", err)
	}
	doc, err := decodeRegistry(data)
	if errors.Is(err, errRegistryVersion) {
		return nil, fmt.Errorf("namespace registry %s: %w", r.path, err)
	}
	if err != nil {
		aside := fmt.Sprintf("%s.corrupt-%d", r.path, time.Now().Unix())
		if rerr := os.Rename(r.path, aside); rerr != nil {
			return nil, fmt.Errorf("namespace registry %s is corrupt (%v) and could not be moved aside: %w", r.path, err, rerr)
		}
		slog.Default().Warn("namespace registry corrupt; moved aside and starting empty with a new epoch",
			"path", r.path, "moved_to", aside, "err", err)
		return r.fresh()
	}
	r.epoch, r.nextID, r.reserveEnd = doc.Epoch, doc.NextID, doc.NextID
	for _, rec := range doc.Namespaces {
		r.byID[rec.ID] = rec.Spec
		r.bySpec[rec.Spec] = rec.ID
	}
	if err := r.replayJournal(); err != nil {
		return nil, err
	}
	// Loaded namespaces count as used at Open: their sessions come back
	// after a restart, and none has been seen yet.
	for id := range r.byID {
		r.used[id] = new(atomic.Int64)
	}
	return r, nil
}

// replayJournal adds the journal's namespaces to those of the snapshot just
// loaded. A journal bound to another snapshot (one written before a
// compaction, or by a kvtierd that knows none) is removed: what it held is
// in the snapshot, or its ids lie below the snapshot's next_id and are
// never handed out again. A torn or damaged line ends the replay, and the
// ids after it are not handed out again either. A journal with entries is
// folded into the snapshot at once. Only a journal that cannot be read, or
// a stale one that cannot be removed, is an error.
func (r *Registry) replayJournal() error {
	data, err := os.ReadFile(r.jpath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("namespace registry journal: %w", err)
	}
	lines := bytes.Split(data, []byte{'\n'})
	var h journalHeader
	if decodeStrict(lines[0], &h) != nil || !r.binds(h) || len(lines) < 2 {
		return r.dropJournal()
	}
	next, clean := h.FirstID, true
	for i, line := range lines[1:] {
		if i == len(lines)-2 && len(line) == 0 {
			break // the newline ending the last line
		}
		var rec registryRecord
		if decodeStrict(line, &rec) != nil || rec.ID != next || next >= r.reserveEnd || rec.Spec.Validate() != nil {
			clean = false
			break
		}
		if _, dup := r.bySpec[rec.Spec]; dup {
			clean = false
			break
		}
		r.byID[rec.ID], r.bySpec[rec.Spec] = rec.Spec, rec.ID
		next++
	}
	if clean && next == h.FirstID {
		r.nextID, r.journalOK = next, true // nothing to fold: append to it
		return nil
	}
	if !clean {
		next = r.reserveEnd
	}
	r.nextID = next
	// Unfolded (a read-only state dir), the journal is only read: the next
	// registration compacts, and fails as any write there would.
	_ = r.compact(nil, nil)
	return nil
}

// binds reports whether a journal with header h extends the snapshot just
// loaded.
func (r *Registry) binds(h journalHeader) bool {
	if h.Version != journalVersion || h.Epoch != r.epoch || h.NextID != r.reserveEnd || h.FirstID == 0 || h.FirstID > h.NextID {
		return false
	}
	for id := range r.byID {
		if id >= h.FirstID {
			return false
		}
	}
	return true
}

func (r *Registry) dropJournal() error {
	r.journalOK = false
	if err := os.Remove(r.jpath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("namespace registry: remove stale journal: %w", err)
	}
	return nil
}

// decodeStrict decodes one JSON value, refusing unknown fields and
// anything after it.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// fresh gives a new (or reset) registry a random epoch and persists it at
// once, so the epoch is stable from the first Open.
func (r *Registry) fresh() (*Registry, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	r.epoch = binary.LittleEndian.Uint64(b[:]) | 1 // never 0, so 0 can mean "unknown"
	r.isNew = true
	r.reserveEnd = r.nextID
	if err := r.persist(nil, nil, r.nextID); err != nil {
		return nil, err
	}
	if err := r.dropJournal(); err != nil { // another epoch's
		return nil, err
	}
	return r, nil
}

var errRegistryVersion = errors.New("unsupported registry version")

func decodeRegistry(data []byte) (*registryDoc, error) {
	// The version first, reading nothing else: a newer format may add
	// fields or change their types, which the strict decode below rejects
	// as corrupt (and a corrupt file is discarded, its ids with it).
	var head struct {
		Version json.RawMessage `json:"version"`
	}
	if json.Unmarshal(data, &head) == nil {
		var v int64
		if json.Unmarshal(head.Version, &v) == nil && v > registryVersion {
			return nil, fmt.Errorf("%w %d (this kvtierd knows %d)", errRegistryVersion, v, registryVersion)
		}
	}
	var doc registryDoc
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	if doc.Version > registryVersion {
		return nil, fmt.Errorf("%w %d (this kvtierd knows %d)", errRegistryVersion, doc.Version, registryVersion)
	}
	if doc.Version != registryVersion {
		return nil, fmt.Errorf("bad version %d", doc.Version)
	}
	if doc.Epoch == 0 {
		return nil, errors.New("missing epoch")
	}
	if doc.NextID == 0 {
		return nil, errors.New("missing next_id")
	}
	if doc.NextID > maxNamespaceID+1 {
		return nil, fmt.Errorf("next_id %d beyond the largest namespace id %d", doc.NextID, maxNamespaceID)
	}
	ids := map[uint32]bool{}
	specs := map[NamespaceSpec]bool{}
	for _, rec := range doc.Namespaces {
		if rec.ID == 0 || rec.ID >= doc.NextID {
			return nil, fmt.Errorf("namespace id %d out of range [1, next_id %d)", rec.ID, doc.NextID)
		}
		if ids[rec.ID] || specs[rec.Spec] {
			return nil, fmt.Errorf("namespace id %d duplicated", rec.ID)
		}
		if err := rec.Spec.Validate(); err != nil {
			return nil, fmt.Errorf("namespace id %d: %w", rec.ID, err)
		}
		ids[rec.ID], specs[rec.Spec] = true, true
	}
	return &doc, nil
}

// Epoch identifies this registry's id space. It changes only when the file
// had to be discarded; anything persisted with namespace ids (the NVMe tier)
// must store the epoch and drop its data when it differs, or blocks of one
// model could be served under another model's reused id.
func (r *Registry) Epoch() uint64 { return r.epoch }

// NewEpoch reports whether this Open started the epoch: there was no
// registry file, or it had to be discarded. Data persisted with namespace
// ids that carries no epoch of its own can belong to the loaded registry
// only when this is false.
func (r *Registry) NewEpoch() bool { return r.isNew }

// Register returns the id of spec, assigning and durably persisting a new
// one if it is unknown. The same spec always gets the same id, across
// restarts too, unless it was reclaimed meanwhile (see Registry). Every
// call marks the namespace used.
func (r *Registry) Register(spec NamespaceSpec) (uint32, error) {
	if err := spec.Validate(); err != nil {
		return 0, err
	}
	id, after, err := r.register(spec)
	if after != nil {
		// Outside wmu: a walk of every tier must not hold up other
		// Registers.
		after()
	}
	return id, err
}

// register is Register under wmu. after, if not nil, is to run once wmu is
// released: it deletes what the tiers still hold under the ids reclaimed (a
// block that reached a tier after the idle check, a move down the tiers it
// missed, would otherwise stay, never served and out of evict's reach,
// until its tier evicted it).
func (r *Registry) register(spec NamespaceSpec) (id uint32, after func(), err error) {
	r.mu.RLock()
	id, ok := r.bySpec[spec]
	u := r.used[id]
	r.mu.RUnlock()
	if ok && r.touch(u) {
		return id, nil, nil
	}

	r.wmu.Lock()
	defer r.wmu.Unlock()
	// Maps change only under wmu, so they can be read here without mu,
	// and no reclaim is under way.
	if id, ok := r.bySpec[spec]; ok {
		r.touch(r.used[id])
		return id, nil, nil // registered while we waited
	}
	var drop map[uint32]int64
	if len(r.byID) >= r.limit {
		var wait time.Duration
		drop, wait = r.takeIdle()
		switch {
		case len(drop) > 0:
		case r.inUse == nil:
			return 0, nil, fmt.Errorf("namespace registry full (%d namespaces)", r.limit)
		case wait > 0:
			return 0, nil, fmt.Errorf("namespace registry full (%d namespaces; next reclaim of idle ones in %s)", r.limit, wait.Round(time.Second))
		default:
			return 0, nil, fmt.Errorf("namespace registry full (%d namespaces, none idle: each has a session, a block in a tier, or was used in the last %s)", r.limit, r.grace)
		}
	}
	id = r.nextID
	if id == 0 || id > maxNamespaceID {
		r.giveBack(drop)
		return 0, nil, errors.New("namespace ids exhausted")
	}
	// Persist before publishing: an id a client has seen must survive a crash.
	rec := registryRecord{ID: id, Spec: spec}
	if len(drop) == 0 && r.journalOK && id < r.reserveEnd {
		if err := r.appendJournal(rec); err != nil {
			r.journalOK = false // it may end in a torn line: compact next time
			return 0, nil, err
		}
	} else if err := r.compact(&rec, drop); err != nil {
		r.giveBack(drop)
		return 0, nil, err
	}
	stamp := new(atomic.Int64)
	stamp.Store(r.stamp())
	r.mu.Lock()
	for old := range drop {
		delete(r.bySpec, r.byID[old])
		delete(r.byID, old)
		delete(r.used, old) // its stamp stays reclaiming for a Register holding it
	}
	r.byID[id] = spec
	r.bySpec[spec] = id
	r.used[id] = stamp
	r.nextID = id + 1
	n := len(r.byID)
	r.mu.Unlock()
	if len(drop) > 0 {
		r.reclaimed.Add(uint64(len(drop)))
		r.log.Info("namespace registry full: reclaimed idle namespaces (no session, no block, unused)",
			"reclaimed", len(drop), "namespaces", n, "limit", r.limit, "unused_for", r.grace, "new_id", id)
	}
	if len(drop) > 0 && r.dropped != nil {
		ids, dropped := slices.Sorted(maps.Keys(drop)), r.dropped
		after = func() { dropped(ids) }
	}
	return id, after, nil
}

// stamp is now on the registry's clock, for used.
func (r *Registry) stamp() int64 { return int64(r.now().Sub(r.t0)) }

// touch marks u used now and reports whether it could: false when a
// reclaim is taking its id out.
func (r *Registry) touch(u *atomic.Int64) bool {
	if u == nil {
		return false
	}
	for {
		old := u.Load()
		if old == reclaiming {
			return false
		}
		now := r.stamp()
		if now <= old || u.CompareAndSwap(old, now) {
			return true
		}
	}
}

// takeIdle picks the idle namespaces of a full registry and marks them
// reclaiming; it returns each with its stamp (for giveBack), or none and
// how long until the next pass may run. Caller holds wmu.
func (r *Registry) takeIdle() (map[uint32]int64, time.Duration) {
	if r.inUse == nil {
		return nil, 0
	}
	now := r.stamp()
	if now < r.nextReclaim {
		return nil, time.Duration(r.nextReclaim - now)
	}
	r.nextReclaim = now + int64(r.every)
	cutoff := now - int64(r.grace)
	ids := map[uint32]struct{}{}
	stamps := map[uint32]int64{}
	for id, u := range r.used { // the map changes only under wmu
		if at := u.Load(); at <= cutoff {
			ids[id], stamps[id] = struct{}{}, at
		}
	}
	if len(ids) == 0 {
		return nil, 0
	}
	r.inUse(ids)
	take := make(map[uint32]int64, len(ids))
	for id := range ids {
		// A Register since the stamp was read keeps it: it may be
		// handing the id to a session the check could not see yet.
		if r.used[id].CompareAndSwap(stamps[id], reclaiming) {
			take[id] = stamps[id]
		}
	}
	return take, 0
}

// giveBack undoes takeIdle after a failed Register. Caller holds wmu.
func (r *Registry) giveBack(drop map[uint32]int64) {
	for id, at := range drop {
		r.used[id].Store(at)
	}
}

// setReclaim lets a full registry reclaim idle namespaces: inUse removes
// from ids every namespace still in use (a session, a block), dropped
// deletes what the tiers hold under the ids reclaimed, and log says how
// many were reclaimed.
func (r *Registry) setReclaim(inUse func(ids map[uint32]struct{}), dropped func(ids []uint32), log *slog.Logger) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.inUse, r.dropped, r.log = inUse, dropped, log
}

// Reclaimed returns how many idle namespaces the registry has reclaimed
// since it was opened.
func (r *Registry) Reclaimed() uint64 { return r.reclaimed.Load() }

// Lookup returns the spec registered under id.
func (r *Registry) Lookup(id uint32) (NamespaceSpec, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.byID[id]
	return s, ok
}

// All returns a copy of every registered namespace.
func (r *Registry) All() map[uint32]NamespaceSpec {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make(map[uint32]NamespaceSpec, len(r.byID))
	for id, s := range r.byID {
		out[id] = s
	}
	return out
}

// appendJournal appends rec to the journal and fsyncs it. Caller holds wmu.
func (r *Registry) appendJournal(rec registryRecord) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(r.jpath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("namespace registry journal: %w", err)
	}
	_, err = f.Write(append(line, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("namespace registry journal: %w", err)
	}
	return nil
}

// compact writes the snapshot (the current contents less the ids in drop,
// plus add, if not nil) with as many ids again set aside for a new, empty
// journal, whose ids start after add's (or at nextID). Caller holds wmu (or
// is the sole owner during Open).
func (r *Registry) compact(add *registryRecord, drop map[uint32]int64) error {
	first := r.nextID
	if add != nil {
		first = add.ID + 1
	}
	end := uint32(min(uint64(first)+uint64(max(minJournalReserve, len(r.byID)-len(drop)+1)), maxNamespaceID+1))
	r.journalOK = false
	if err := r.persist(add, drop, end); err != nil {
		return err
	}
	r.reserveEnd = end
	if first >= end {
		return r.dropJournal()
	}
	h, err := json.Marshal(journalHeader{Version: journalVersion, Epoch: r.epoch, NextID: end, FirstID: first})
	if err != nil {
		return err
	}
	// Were this to fail, the snapshot alone is whole: the next
	// registration compacts again.
	if writeFileAtomic(r.jpath, append(h, '\n'), 0o640) == nil {
		r.journalOK = true
	}
	return nil
}

// persist writes the current contents less the ids in drop, plus add (if
// not nil), with next_id nextID, atomically: temp file, fsync, rename, fsync
// the directory so the rename itself is durable. Caller holds wmu (or is
// the sole owner during Open). Reclaimed ids just leave gaps below next_id,
// which every kvtierd reads as a valid registry.
func (r *Registry) persist(add *registryRecord, drop map[uint32]int64, nextID uint32) error {
	doc := registryDoc{Version: registryVersion, Epoch: r.epoch, NextID: nextID}
	for id, s := range r.byID {
		if _, gone := drop[id]; !gone {
			doc.Namespaces = append(doc.Namespaces, registryRecord{ID: id, Spec: s})
		}
	}
	if add != nil {
		doc.Namespaces = append(doc.Namespaces, *add)
	}
	slices.SortFunc(doc.Namespaces, func(a, b registryRecord) int { return cmp.Compare(a.ID, b.ID) })
	if doc.Namespaces == nil {
		doc.Namespaces = []registryRecord{}
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if err := writeFileAtomic(r.path, data, 0o640); err != nil {
		return fmt.Errorf("namespace registry: %w", err)
	}
	return nil
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
