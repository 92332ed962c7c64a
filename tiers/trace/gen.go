package trace

import (
	"math"
	"math/rand/v2"
	"sort"
)

// Synthetic trace generators. Each is deterministic for a seed and returns
// requests sorted by timestamp with prefix-chained ids (a fresh id for every
// new block, shared ids for shared prefixes), like the Mooncake trace. Their
// shapes differ on purpose so a policy that only fits one of them shows:
//
//   - Chat: multi-turn sessions; each turn's prompt is the previous turn's
//     prompt plus the answer and a new user message, behind one of a few
//     Zipf-popular system prompts. Reuse is recency-driven (the next turn
//     of a live session).
//   - Docs: a catalogue of shared documents (RAG contexts, few-shot
//     templates) with Zipf popularity, each followed by a unique question.
//     Reuse is frequency-driven; the suffixes are never reused.
//   - Mixed: Chat and Docs interleaved with scans: one-off long prompts
//     (pasted files) that are never reused and flush recency-only caches.
//
// The parameters are plain round numbers describing a plausible service,
// not values fitted to any trace.

// gen holds generator state: a seeded PRNG and the next fresh block id.
type gen struct {
	r    *rand.Rand
	next int64
}

func newGen(seed uint64) *gen { return &gen{r: rand.New(rand.NewPCG(seed, 0x6b76746965722d67))} }

func (g *gen) fresh(n int) []int64 {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = g.next
		g.next++
	}
	return ids
}

// exp draws an exponential variate with the given mean.
func (g *gen) exp(mean float64) float64 { return g.r.ExpFloat64() * mean }

// lognormal draws a log-normal integer ≥ lo with the given median.
func (g *gen) lognormal(median, sigma float64, lo, hi int) int {
	v := int(math.Round(median * math.Exp(sigma*g.r.NormFloat64())))
	return min(max(v, lo), hi)
}

// geometric draws a geometric variate ≥ 1 with the given mean.
func (g *gen) geometric(mean float64) int {
	p := 1 / mean
	n := 1
	for g.r.Float64() > p {
		n++
	}
	return n
}

// zipf samples ranks 0..n-1 with P(k) ∝ 1/(k+1)^s, for any s > 0.
type zipf struct{ cdf []float64 }

func newZipf(n int, s float64) *zipf {
	z := &zipf{cdf: make([]float64, n)}
	sum := 0.0
	for k := range n {
		sum += 1 / math.Pow(float64(k+1), s)
		z.cdf[k] = sum
	}
	for k := range z.cdf {
		z.cdf[k] /= sum
	}
	return z
}

func (z *zipf) draw(r *rand.Rand) int {
	u := r.Float64()
	return min(sort.SearchFloat64s(z.cdf, u), len(z.cdf)-1)
}

func blocksToReq(ts float64, ids []int64, out int) Request {
	return Request{Timestamp: int64(ts), InputLength: len(ids) * BlockTokens, OutputLength: out, HashIDs: ids}
}

func sortByTime(reqs []Request) []Request {
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Timestamp < reqs[j].Timestamp })
	return reqs
}

// Chat generates n requests of multi-turn chat: sessions arrive as a Poisson
// process (2 sessions/s), each picks one of 20 system prompts (Zipf s=1,
// 2–16 blocks), runs a geometric number of turns (mean 4) separated by
// exponential think times (mean 30 s), and each turn appends the previous
// answer and a new message (log-normal, median 2 blocks).
func Chat(seed uint64, n int) []Request {
	g := newGen(seed)
	sys := make([][]int64, 20)
	for i := range sys {
		sys[i] = g.fresh(2 + g.r.IntN(15))
	}
	pick := newZipf(len(sys), 1)
	var reqs []Request
	t := 0.0
	for len(reqs) < n {
		t += g.exp(500)
		chain := append([]int64(nil), sys[pick.draw(g.r)]...)
		turns := g.geometric(4)
		at := t
		for k := 0; k < turns && len(reqs) < n; k++ {
			chain = append(chain, g.fresh(g.lognormal(2, 0.8, 1, 64))...)
			reqs = append(reqs, blocksToReq(at, append([]int64(nil), chain...), g.lognormal(300, 0.7, 1, 4096)))
			at += g.exp(30000)
		}
	}
	return sortByTime(reqs)
}

// Docs generates n requests against a catalogue of 2,000 shared documents
// with Zipf(s=0.9) popularity, each log-normal long (median 16 blocks), 1 in
// 4 behind a shared instruction prefix of 4 blocks, followed by a unique
// question (log-normal, median 2 blocks). Poisson arrivals, 4 requests/s.
func Docs(seed uint64, n int) []Request {
	g := newGen(seed)
	return g.docs(n, 0, 250)
}

func (g *gen) docs(n int, t0, gapMs float64) []Request {
	instr := g.fresh(4)
	docs := make([][]int64, 2000)
	for i := range docs {
		var d []int64
		if g.r.IntN(4) == 0 {
			d = append(d, instr...)
		}
		docs[i] = append(d, g.fresh(g.lognormal(16, 0.8, 1, 256))...)
	}
	// Popularity ranks are a random permutation of creation order so that
	// ids carry no hint of popularity.
	perm := g.r.Perm(len(docs))
	pick := newZipf(len(docs), 0.9)
	reqs := make([]Request, 0, n)
	t := t0
	for range n {
		t += g.exp(gapMs)
		ids := append([]int64(nil), docs[perm[pick.draw(g.r)]]...)
		ids = append(ids, g.fresh(g.lognormal(2, 0.8, 1, 64))...)
		reqs = append(reqs, blocksToReq(t, ids, g.lognormal(200, 0.7, 1, 4096)))
	}
	return reqs
}

// Mixed generates about n requests: 45% chat, 45% docs and 10% scans, i.e.
// one-off prompts of log-normal length (median 120 blocks) that are never
// reused, all interleaved in time.
func Mixed(seed uint64, n int) []Request {
	nChat, nDocs := n*45/100, n*45/100
	nScan := n - nChat - nDocs
	chat := Chat(seed, nChat)
	g := newGen(seed ^ 0x9e3779b97f4a7c15)
	g.next = 1 << 40 // disjoint from the chat ids
	span := float64(1)
	if len(chat) > 0 {
		span = float64(chat[len(chat)-1].Timestamp + 1)
	}
	reqs := append([]Request(nil), chat...)
	reqs = append(reqs, g.docs(nDocs, 0, span/float64(max(nDocs, 1)))...)
	for range nScan {
		ids := g.fresh(g.lognormal(120, 0.5, 16, 1024))
		reqs = append(reqs, blocksToReq(g.r.Float64()*span, ids, g.lognormal(200, 0.7, 1, 4096)))
	}
	return sortByTime(reqs)
}
