package main

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/internal/memcopy"
	"github.com/kvtier/kvtier/shm"
)

// byteSize is a flag value that accepts "2MiB", "512KiB", "1048576".
type byteSize uint64

func (b *byteSize) String() string { return humanize.IBytes(uint64(*b)) }
func (b *byteSize) Type() string   { return "size" }
func (b *byteSize) Set(s string) error {
	v, err := humanize.ParseBytes(s)
	if err != nil {
		return err
	}
	if v == 0 || v > shm.MaxBlockBytes {
		return fmt.Errorf("%s not in [1 B, %s]", s, humanize.IBytes(shm.MaxBlockBytes))
	}
	*b = byteSize(v)
	return nil
}

// mixWeights are the relative frequencies of the ops of --mode mix.
type mixWeights struct{ Put, Get, Lookup uint64 }

func (m mixWeights) total() uint64 { return m.Put + m.Get + m.Lookup }

// pick maps r in [0, total) to an op kind.
func (m mixWeights) pick(r uint64) opKind {
	switch {
	case r < m.Put:
		return opPut
	case r < m.Put+m.Get:
		return opGet
	}
	return opLookup
}

func (m mixWeights) String() string {
	return fmt.Sprintf("put=%d,get=%d,lookup=%d", m.Put, m.Get, m.Lookup)
}

// parseMix parses "put=1,get=3,lookup=0". Omitted ops weigh 0; at least one
// weight must be positive.
func parseMix(s string) (mixWeights, error) {
	var m mixWeights
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, val, ok := strings.Cut(part, "=")
		name = strings.ToLower(strings.TrimSpace(name))
		if !ok {
			return m, fmt.Errorf("mix %q: %q is not op=weight", s, part)
		}
		w, err := strconv.ParseUint(strings.TrimSpace(val), 10, 32)
		if err != nil {
			return m, fmt.Errorf("mix %q: weight of %s: want a non-negative integer, got %q", s, name, val)
		}
		if seen[name] {
			return m, fmt.Errorf("mix %q: %s given twice", s, name)
		}
		seen[name] = true
		switch name {
		case "put":
			m.Put = w
		case "get":
			m.Get = w
		case "lookup":
			m.Lookup = w
		default:
			return m, fmt.Errorf("mix %q: unknown op %q (want put, get, lookup)", s, name)
		}
	}
	if m.total() == 0 {
		return m, fmt.Errorf("mix %q: every weight is zero", s)
	}
	return m, nil
}

// quantile returns the nearest-rank q-quantile of sorted samples: the
// smallest sample such that at least q of all samples are ≤ it. Exact, no
// interpolation, so p999 of 1000 samples is the maximum.
func quantile(sorted []int64, q float64) int64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(n))) - 1
	return sorted[min(max(i, 0), n-1)]
}

// latency summarizes one op kind's samples, in microseconds.
type latency struct {
	Count  int     `json:"count"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
	P999US float64 `json:"p999_us"`
	MaxUS  float64 `json:"max_us"`
}

// summarize sorts samples (nanoseconds) in place and summarizes them.
func summarize(samples []int64) latency {
	if len(samples) == 0 {
		return latency{}
	}
	slices.Sort(samples)
	var sum float64
	for _, s := range samples {
		sum += float64(s)
	}
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	return latency{
		Count:  len(samples),
		MeanUS: sum / float64(len(samples)) / 1e3,
		P50US:  us(quantile(samples, 0.50)),
		P99US:  us(quantile(samples, 0.99)),
		P999US: us(quantile(samples, 0.999)),
		MaxUS:  us(samples[len(samples)-1]),
	}
}

// memcpyBench measures single-core copy bandwidth the way the host tier
// uses memory: a block-size source copied into rotating destinations spread
// over a region as large as the working set (so the destinations are not
// cache-hot, as arena slots are not), then copied back out into one
// block-size buffer with the client library's own copy-out routine
// (memcopy.ToHot, as its Get does). Bytes are counted like kvtier's PUT+GET:
// in plus out.
type memcpyBench struct {
	block  int
	region []byte
	src    []byte
	dst    []byte
}

// newMemcpyBench maps and pre-faults a region of regionBytes (rounded down
// to whole blocks, at least two). Plain anonymous memory without hugepage
// advice matches the arena's default 4 KiB shmem pages.
func newMemcpyBench(block int, regionBytes int64) (*memcpyBench, error) {
	n := max(regionBytes/int64(block), 2)
	// MAP_POPULATE faults the region in with one call (a page-by-page
	// first touch of 1 GiB takes seconds); the writes below then only make
	// sure no page is a shared zero page.
	region, err := unix.Mmap(-1, 0, int(n)*block, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("memcpy baseline: map %s: %w", humanize.IBytes(uint64(n)*uint64(block)), err)
	}
	for i := 0; i < len(region); i += 4096 {
		region[i] = byte(i >> 12)
	}
	m := &memcpyBench{block: block, region: region, src: make([]byte, block), dst: make([]byte, block)}
	fillPattern(m.src)
	copy(m.dst, m.src)
	return m, nil
}

func (m *memcpyBench) close() { unix.Munmap(m.region) }

// run copies for about d on one locked OS thread and returns GB/s (1e9).
func (m *memcpyBench) run(d time.Duration) float64 {
	res := make(chan float64)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		slots := len(m.region) / m.block
		var bytes int64
		t0 := time.Now()
		for i := 0; ; i++ {
			off := (i % slots) * m.block
			slot := m.region[off : off+m.block]
			copy(slot, m.src)
			memcopy.ToHot(m.dst, slot)
			bytes += 2 * int64(m.block)
			// Check the clock every few copies: a 1 KiB block copies in
			// ~100 ns, about as long as reading the clock.
			if i%16 == 15 {
				if el := time.Since(t0); el >= d {
					res <- float64(bytes) / el.Seconds() / 1e9
					return
				}
			}
		}
	}()
	return <-res
}

// fillPattern writes non-repeating bytes so no layer can shortcut zeros.
func fillPattern(b []byte) {
	x := uint64(0x9e3779b97f4a7c15)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}
