package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
)

// TestRingStressManySessions drives many sessions at once through small
// rings (64 entries), with batches larger than a ring, leases held past the
// client's orphan limit and released in bulk, lookups that span the data
// area, and deletes. The loops' sleep bound is an hour and spin is off, so
// every wait goes through the futex doorbells and a lost wake-up hangs its
// call until the deadline.
func TestRingStressManySessions(t *testing.T) {
	for _, spin := range []int{0, 50} {
		t.Run(fmt.Sprintf("spin%d", spin), func(t *testing.T) { runRingStress(t, spin) })
	}
}

func runRingStress(t *testing.T, spin int) {
	cfg := testConfig(t) // 8 MiB host tier
	cfg.Session.RingEntries = 64
	cfg.Session.DataBytes = 64 * KiB
	cfg.Session.SpinMicros = spin
	r := startDaemonWith(t, cfg, slog.New(slog.DiscardHandler), func(d *Daemon) { d.sleepBound = time.Hour })
	const (
		sessions = 6
		workers  = 3
		batch    = 150 // > ring entries
		rounds   = 12
		bs       = 4096
	)
	c := dialDaemon(t, cfg)
	var wg sync.WaitGroup
	errc := make(chan error, sessions*workers)
	for si := range sessions {
		s, err := c.Open(context.Background(), testNamespace(bs))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := ringStressWorker(s, uint64(si*workers+w+1), batch, rounds, bs); err != nil {
					errc <- fmt.Errorf("session %d worker %d: %w", si, w, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	hung := false
	for err := range errc {
		t.Error(err)
		hung = hung || errors.Is(err, context.DeadlineExceeded)
	}
	if hung {
		// Seen once in CI and not reproduced: leave the evidence.
		dumpRings(t, r.d)
	}
}

// dumpRings logs every session's ring words and, while the sessions still
// run, the stacks of the process (daemon and clients alike), for a call
// that hung.
func dumpRings(t *testing.T, d *Daemon) {
	d.mu.Lock()
	for id, s := range d.sessions {
		t.Logf("session %d: %v; loop stopped %v, deferred %d", id, s.ring, s.stopped(), len(s.deferred))
	}
	d.mu.Unlock()
	t.Logf("spinning loops %d", d.spinners.Load())
	buf := make([]byte, 1<<20)
	t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
}

func ringStressWorker(s *client.Session, seed uint64, batch, rounds, bs int) error {
	rng := rand.New(rand.NewPCG(seed, 1))
	hs := testBlocks(seed, batch)
	blocks := make([][]byte, batch)
	dsts := make([][]byte, batch)
	for i, h := range hs {
		blocks[i] = block(h, bs)
		dsts[i] = make([]byte, bs)
	}
	op := func(name string, f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		t0 := time.Now()
		if err := f(ctx); err != nil {
			return fmt.Errorf("%s after %v: %w", name, time.Since(t0), err)
		}
		return nil
	}
	for r := range rounds {
		if err := op("put", func(ctx context.Context) error {
			_, err := s.PutBatch(ctx, hs, blocks)
			if errors.Is(err, client.ErrFull) {
				return nil
			}
			return err
		}); err != nil {
			return err
		}
		if err := op("get", func(ctx context.Context) error {
			found, err := s.GetBatch(ctx, hs, dsts)
			if err != nil {
				return err
			}
			for i := range found {
				if found[i] && !bytes.Equal(dsts[i], blocks[i]) {
					return fmt.Errorf("round %d block %d: wrong bytes", r, i)
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if err := op("lookup", func(ctx context.Context) error {
			long := make([]client.Hash, 0, 5000)
			for len(long) < 5000 {
				long = append(long, hs...)
			}
			_, err := s.Lookup(ctx, long)
			return err
		}); err != nil {
			return err
		}
		if err := op("acquire-hold", func(ctx context.Context) error {
			ls, err := s.AcquireBatch(ctx, hs)
			if err != nil {
				return err
			}
			for i, l := range ls {
				if l != nil && !bytes.Equal(l.Bytes(), blocks[i]) {
					return fmt.Errorf("round %d lease %d: wrong bytes", r, i)
				}
			}
			return s.ReleaseBatch(ls)
		}); err != nil {
			return err
		}
		if err := op("nop", s.Nop); err != nil {
			return err
		}
		if rng.IntN(3) == 0 {
			if err := op("delete", func(ctx context.Context) error {
				_, err := s.DeleteBatch(ctx, hs[:rng.IntN(batch)])
				return err
			}); err != nil {
				return err
			}
		}
	}
	return nil
}
