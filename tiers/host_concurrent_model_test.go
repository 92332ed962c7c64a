package tiers

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
)

// TestHostConcurrentModel drives one Host from several goroutines at once:
// reserve, write a payload that is a function of (key, generation), commit
// or abort, acquire and verify under the lease (twice, with a yield
// between), release, pin the coldest blocks and unpin them (dropping some),
// delete, delete whole namespaces (so slabs change class), and lookups,
// with mixed block sizes that force compaction and cross-class eviction.
// A checker re-derives the allocator's state from its slabs meanwhile. Two
// variants: an arena, and slots whose compaction copies go through Move
// (one in eight failing, which drops the block).
func TestHostConcurrentModel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		slots bool
	}{{"arena", false}, {"slots-failing-move", true}} {
		t.Run(tc.name, func(t *testing.T) { runHostConcurrentModel(t, tc.slots) })
	}
}

func runHostConcurrentModel(t *testing.T, slots bool) {
	const (
		slabBytes = 64 << 10
		nSlabs    = 24
		workers   = 4
		keysPerNS = 48
	)
	ops := 6000
	if raceEnabled {
		ops = 2500
	}
	sizes := []int64{4096, 8192, 12000, 20000, 40000, 64 << 10, 1}
	backing := make([]byte, slabBytes*nSlabs)
	var h *Host
	var err error
	var moveCalls atomic.Uint64
	if slots {
		h, err = NewSlots(int64(len(backing)), HostConfig{SlabBytes: slabBytes, Move: func(dst, src, n int64) error {
			if moveCalls.Add(1)%8 == 0 {
				return errors.New("injected move failure")
			}
			copy(backing[dst:dst+n], backing[src:src+n])
			return nil
		}})
	} else {
		h, err = NewHost(backing, HostConfig{SlabBytes: slabBytes})
	}
	if err != nil {
		t.Fatal(err)
	}

	// gens maps a handle to the generation its reserver wrote; stored
	// before Commit, so anyone who gets the handle from the Host finds it.
	var gens sync.Map
	var nextGen atomic.Uint64
	keyOf := func(rng *rand.Rand) (Key, int64) {
		ns := rng.IntN(len(sizes))
		return Key{NS: uint32(ns), Hash: shm.Hash{Hi: uint64(ns)*7 + 1, Lo: uint64(rng.IntN(keysPerNS))}}, sizes[ns]
	}
	verify := func(hd *Handle, what string) error {
		g, ok := gens.Load(hd)
		if !ok {
			return fmt.Errorf("%s: handle %v never written by a reserver", what, hd.Key)
		}
		if err := checkPattern(backing, hd, g.(uint64)); err != nil {
			return fmt.Errorf("%s gen %d: %w", what, g.(uint64), err)
		}
		return nil
	}

	stop := make(chan struct{})
	var checkErr error
	checkDone := make(chan struct{})
	go func() {
		defer close(checkDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if err := checkHost(h); err != nil {
				checkErr = err
				return
			}
		}
	}()

	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			var leases []*Handle
			chain := make([]Key, 8)
			tiersOut := make([]shm.Tier, 8)
			fail := func(err error) { errc <- fmt.Errorf("worker %d: %w", w, err) }
			defer func() {
				for _, hd := range leases {
					h.Release(hd)
				}
			}()
			for i := 0; i < ops; i++ {
				switch r := rng.IntN(100); {
				case r < 35: // put
					k, size := keyOf(rng)
					hd, err := h.Reserve(k, size)
					if errors.Is(err, ErrExists) || errors.Is(err, ErrFull) {
						continue
					}
					if err != nil {
						fail(err)
						return
					}
					g := nextGen.Add(1)
					gens.Store(hd, g)
					writePattern(backing, hd, g)
					if rng.IntN(4) == 0 {
						// Let others compact and evict around the reservation.
						time.Sleep(0)
					}
					if err := verify(hd, "reserved"); err != nil {
						fail(err)
						return
					}
					switch rng.IntN(6) {
					case 0:
						err = h.Abort(hd)
					case 1:
						if err = h.CommitPinned(hd); err == nil {
							if err = verify(hd, "commit-pinned"); err == nil {
								_, err = h.Unpin(hd, false)
							}
						}
					default:
						err = h.Commit(hd)
					}
					if err != nil {
						fail(err)
						return
					}
				case r < 60: // acquire, verify, keep the lease a while
					k, _ := keyOf(rng)
					if hd, ok := h.Acquire(k); ok {
						if err := verify(hd, "acquired"); err != nil {
							fail(err)
							return
						}
						leases = append(leases, hd)
					}
				case r < 75: // re-verify and release a lease
					if len(leases) == 0 {
						continue
					}
					j := rng.IntN(len(leases))
					hd := leases[j]
					leases[j] = leases[len(leases)-1]
					leases = leases[:len(leases)-1]
					if err := verify(hd, "leased"); err != nil {
						fail(err)
						return
					}
					if err := h.Release(hd); err != nil {
						fail(err)
						return
					}
				case r < 85: // delete
					k, _ := keyOf(rng)
					h.Delete(k)
				case r < 86: // class churn: a whole namespace goes
					h.DeleteNS(uint32(rng.IntN(len(sizes))))
				case r < 92: // the mover: pin the coldest, check, unpin
					for _, hd := range h.PinColdest(1+rng.IntN(4), nil) {
						if err := verify(hd, "pinned-coldest"); err != nil {
							fail(err)
							return
						}
						if _, err := h.Unpin(hd, rng.IntN(2) == 0); err != nil {
							fail(err)
							return
						}
					}
				default: // lookup
					k, _ := keyOf(rng)
					for j := range chain {
						chain[j] = Key{NS: k.NS, Hash: shm.Hash{Hi: k.Hash.Hi, Lo: uint64(j)}}
					}
					h.Lookup(chain, tiersOut)
				}
				// Keep leases bounded so that the tier keeps turning over.
				for len(leases) > 6 {
					hd := leases[0]
					leases = leases[1:]
					if err := h.Release(hd); err != nil {
						fail(err)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	<-checkDone
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if checkErr != nil {
		t.Fatalf("invariants: %v", checkErr)
	}
	mustCheck(t, h)
	// Every committed block still reads as its generation.
	for _, hd := range h.PinAll() {
		if err := verify(hd, "final"); err != nil {
			t.Error(err)
		}
		if _, err := h.Unpin(hd, false); err != nil {
			t.Fatal(err)
		}
	}
	for ns := range sizes {
		h.DeleteNS(uint32(ns))
	}
	mustCheck(t, h)
	st := h.Stats()
	if st.UsedBytes != 0 || st.Blocks != 0 || st.Reserved != 0 || st.Leased != 0 || st.SlabsFree != st.SlabsTotal {
		t.Fatalf("after deleting everything: %+v", st)
	}
	if st.Compactions == 0 || st.Evictions == 0 {
		t.Errorf("the run never compacted (%d) or evicted (%d): it tests too little", st.Compactions, st.Evictions)
	}
	t.Logf("%d compactions (%d blocks moved), %d evictions, %d moves", st.Compactions, st.CompactedBlocks, st.Evictions, moveCalls.Load())
}
