package policy

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/tiers/trace"
)

// Workload is a trace compiled for fast repeated simulation: every block id
// mapped to a Key and a dense index, the chains flattened.
type Workload struct {
	Reqs    []trace.Request
	keys    []Key   // per flattened reference
	dense   []int32 // per flattened reference: dense block index
	starts  []int   // per request: offset of its first reference; len = len(Reqs)+1
	nBlocks int
	next    []int32 // per flattened reference: index of the next reference to the same block, or noNext
}

const noNext = int32(1<<31 - 1)

// KeyOf is the Key the simulator uses for trace block id.
func KeyOf(id int64) Key { return Key{NS: 1, Lo: uint64(id)} }

// Compile prepares reqs for Simulate.
func Compile(reqs []trace.Request) *Workload {
	w := &Workload{Reqs: reqs, starts: make([]int, 0, len(reqs)+1)}
	idx := make(map[int64]int32)
	for _, r := range reqs {
		w.starts = append(w.starts, len(w.keys))
		for _, id := range r.HashIDs {
			d, ok := idx[id]
			if !ok {
				d = int32(len(idx))
				idx[id] = d
			}
			w.keys = append(w.keys, KeyOf(id))
			w.dense = append(w.dense, d)
		}
	}
	w.starts = append(w.starts, len(w.keys))
	w.nBlocks = len(idx)
	w.next = make([]int32, len(w.keys))
	last := make([]int32, w.nBlocks)
	for i := range last {
		last[i] = noNext
	}
	for i := len(w.keys) - 1; i >= 0; i-- {
		d := w.dense[i]
		w.next[i] = last[d]
		last[d] = int32(i)
	}
	return w
}

// Refs is the number of block references (sum of chain lengths).
func (w *Workload) Refs() int { return len(w.keys) }

// Blocks is the number of distinct blocks.
func (w *Workload) Blocks() int { return w.nBlocks }

// Result is the outcome of one simulation.
type Result struct {
	Policy     string
	Capacity   int // blocks; 0 = unlimited
	Requests   int
	Refs       int // block references
	Hits       int // leading resident blocks, summed over requests
	Inserts    int
	Rejects    int // misses refused by Admit
	Evictions  int
	MaxBlocks  int // most blocks resident at once
	LateBlocks int // resident blocks after a request's first miss (recomputed, not hits)
}

// HitRatio is the prefix hit ratio: Hits / Refs.
func (r Result) HitRatio() float64 {
	if r.Refs == 0 {
		return 0
	}
	return float64(r.Hits) / float64(r.Refs)
}

func (r Result) String() string {
	return fmt.Sprintf("%s cap=%d hit=%.4f inserts=%d rejects=%d evictions=%d", r.Policy, r.Capacity, r.HitRatio(), r.Inserts, r.Rejects, r.Evictions)
}

// Simulate replays reqs against one cache of capacity blocks (≤ 0 =
// unlimited) managed by p. See (*Workload).Simulate.
func Simulate(reqs []trace.Request, capacity int, p Policy) Result {
	return Compile(reqs).Simulate(capacity, p)
}

// Simulate replays the workload against one cache of capacity blocks (≤ 0 =
// unlimited) managed by p, following the Policy call protocol:
//
//  1. Lookup: hits = number of leading blocks of the chain that are resident
//     (it stops at the first miss, as the daemon's Lookup does).
//  2. Every block of the request is then referenced once, in chain order:
//     a resident block gets Access — also when it lies after the first miss;
//     such a block is recomputed by the engine (not a hit) but its Put finds
//     it present, so the tier sees a reference; it is counted in LateBlocks —
//     and an absent block is offered to Admit and, if admitted, Inserted,
//     after which Victims are evicted while the cache is over capacity.
//
// The prefix hit ratio is sum(hits) / sum(len(hash_ids)). With LRU and the
// Belady oracle this reproduces the reference figures of
// shared/workloads/README.md.
func (w *Workload) Simulate(capacity int, p Policy) Result {
	res, _ := w.SimulateContext(context.Background(), capacity, p)
	return res
}

// SimulateContext is Simulate that gives up when ctx is done (it checks
// every simCheckEvery requests), returning the partial Result and ctx's
// error.
func (w *Workload) SimulateContext(ctx context.Context, capacity int, p Policy) (Result, error) {
	res := Result{Policy: p.Name(), Capacity: max(capacity, 0), Requests: len(w.Reqs), Refs: len(w.keys)}
	resident := make([]bool, w.nBlocks)
	where := make(map[Key]int32, min(w.nBlocks, 1<<20))
	for i, k := range w.keys {
		where[k] = w.dense[i]
	}
	n := 0
	for ri := range w.Reqs {
		if ri%simCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
		}
		lo, hi := w.starts[ri], w.starts[ri+1]
		h := lo
		for h < hi && resident[w.dense[h]] {
			h++
		}
		res.Hits += h - lo
		a := AccessInfo{ChainLen: hi - lo, TimeMs: w.Reqs[ri].Timestamp, Request: uint64(ri)}
		for i := lo; i < hi; i++ {
			a.Pos = i - lo
			a.HasParent = i > lo
			if a.HasParent {
				a.Parent = w.keys[i-1]
			} else {
				a.Parent = Key{}
			}
			k, d := w.keys[i], w.dense[i]
			if resident[d] {
				if i >= h {
					res.LateBlocks++
				}
				p.Access(k, a)
				continue
			}
			if !p.Admit(k, a) {
				res.Rejects++
				continue
			}
			p.Insert(k, a)
			resident[d] = true
			n++
			res.Inserts++
			for capacity > 0 && n > capacity {
				v, ok := p.Victim()
				if !ok {
					panic(fmt.Sprintf("policy %s: no victim with %d blocks resident", p.Name(), n))
				}
				vd, known := where[v]
				if !known || !resident[vd] {
					panic(fmt.Sprintf("policy %s: victim %v is not resident", p.Name(), v))
				}
				p.Remove(v)
				resident[vd] = false
				n--
				res.Evictions++
			}
			res.MaxBlocks = max(res.MaxBlocks, n)
		}
	}
	if p.Len() != n {
		panic(fmt.Sprintf("policy %s: Len() = %d, simulator holds %d blocks", p.Name(), p.Len(), n))
	}
	return res, nil
}

// simCheckEvery is how many requests SimulateContext simulates between
// looks at its context.
const simCheckEvery = 64
