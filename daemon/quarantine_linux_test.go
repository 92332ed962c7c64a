package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/shm"
	"github.com/kvtier/kvtier/tiers"
)

// quarantineRig is a host tier with n open reservations and a running
// quarantine.
func quarantineRig(t *testing.T, n int, hold time.Duration) (*tiers.Host, []*tiers.Handle, *quarantine, context.CancelFunc) {
	t.Helper()
	const slab = 1 << 20
	h, err := tiers.NewHost(make([]byte, 4*slab), tiers.HostConfig{SlabBytes: slab})
	if err != nil {
		t.Fatal(err)
	}
	hs := make([]*tiers.Handle, n)
	for i := range hs {
		if hs[i], err = h.Reserve(tiers.Key{NS: 1, Hash: shm.Hash{Lo: uint64(i + 1)}}, 64<<10); err != nil {
			t.Fatal(err)
		}
	}
	q := newQuarantine(slog.New(slog.NewTextHandler(io.Discard, nil)))
	q.hold.Store(int64(hold))
	ctx, cancel := context.WithCancel(context.Background())
	go q.run(ctx)
	t.Cleanup(func() { q.close(true); cancel() })
	return h, hs, q, cancel
}

func reservedOf(h *tiers.Host) int { return h.Stats().Reserved }

func waitReserved(t *testing.T, h *tiers.Host, want int, within time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	for reservedOf(h) != want {
		if time.Since(t0) > within {
			t.Fatalf("reserved %d after %v, want %d", reservedOf(h), within, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(t0)
}

func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// TestQuarantineReleasesOnExit: reservations of a live process are held;
// its exit (a zombie already counts: its files are closed) releases them
// at once, long before the hold; the gauge follows.
func TestQuarantineReleasesOnExit(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // after the rigs' cleanups
	for _, reap := range []bool{false, true} {
		h, hs, q, _ := quarantineRig(t, 3, time.Minute)
		cmd := sleeper(t)
		q.add(uint32(cmd.Process.Pid), hs)
		time.Sleep(5 * quarantinePoll) // several polls: nothing may move
		if r, b := reservedOf(h), q.blocks.Load(); r != 3 || b != 3 {
			t.Fatalf("process alive: %d reserved, %d quarantined; want 3 and 3", r, b)
		}
		cmd.Process.Kill()
		if reap {
			cmd.Wait()
		}
		if took := waitReserved(t, h, 0, 10*time.Second); took > 5*time.Second {
			t.Errorf("released %v after the exit (reaped %v)", took, reap)
		}
		if b, n := q.blocks.Load(), q.total.Load(); b != 0 || n != 3 {
			t.Errorf("gauge %d, total %d after release; want 0 and 3", b, n)
		}
		q.close(true)
	}
}

// TestQuarantineHoldBoundsALiveProcess: a process that never exits (this
// test) gets its slots back after the hold, not before.
func TestQuarantineHoldBoundsALiveProcess(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // after the rigs' cleanups
	const hold = 300 * time.Millisecond
	h, hs, q, _ := quarantineRig(t, 2, hold)
	t0 := time.Now()
	q.add(uint32(os.Getpid()), hs)
	if r := reservedOf(h); r != 2 {
		t.Fatalf("%d reserved right after add, want 2", r)
	}
	waitReserved(t, h, 0, 10*time.Second)
	if el := time.Since(t0); el < hold {
		t.Errorf("released after %v, before the hold of %v with the process alive", el, hold)
	}
}

// TestQuarantineGoneProcess: a process already reaped holds nothing.
func TestQuarantineGoneProcess(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // after the rigs' cleanups
	h, hs, q, _ := quarantineRig(t, 2, time.Minute)
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	q.add(uint32(cmd.Process.Pid), hs)
	if r, b := reservedOf(h), q.blocks.Load(); r != 0 || b != 0 {
		t.Fatalf("reaped process: %d reserved, %d quarantined; want 0 and 0", r, b)
	}
}

// TestQuarantineCloseWaits: close returns once the entries are released
// (here by the process's exit), and a cancelled context releases what is
// left at once.
func TestQuarantineCloseWaits(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // after the rigs' cleanups
	h, hs, q, cancel := quarantineRig(t, 2, time.Minute)
	cmd := sleeper(t)
	q.add(uint32(cmd.Process.Pid), hs[:1])
	closed := make(chan struct{})
	go func() { q.close(true); close(closed) }()
	select {
	case <-closed:
		t.Fatal("close returned with a live process's reservation held")
	case <-time.After(5 * quarantinePoll):
	}
	cmd.Process.Kill()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not return after the process exited")
	}
	if r := reservedOf(h); r != 1 {
		t.Fatalf("%d reserved after close, want 1 (the one never quarantined)", r)
	}

	h2, hs2, q2, cancel2 := quarantineRig(t, 2, time.Minute)
	q2.add(uint32(os.Getpid()), hs2)
	cancel2()
	waitReserved(t, h2, 0, 10*time.Second)
	_, _ = hs, cancel
}

// TestQuarantinedKeyCanBeReservedAgain: a held reservation keeps its slot,
// not its key. Another session's put of the same block must get a slot of
// its own: while the dead session's key stayed reserved, such puts were
// answered "exists" (the client took the block as stored) for as long as
// the hold lasted.
func TestQuarantinedKeyCanBeReservedAgain(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // after the rigs' cleanups
	h, hs, q, cancel := quarantineRig(t, 1, time.Minute)
	t.Cleanup(cancel) // before the rig's close: releases the held slot at once
	q.add(uint32(os.Getpid()), hs)
	if b := q.blocks.Load(); b != 1 {
		t.Fatalf("%d quarantined, want 1", b)
	}
	hd, err := h.Reserve(hs[0].Key, 64<<10)
	if err != nil {
		t.Fatalf("reserve of a quarantined reservation's key: %v", err)
	}
	if hd.Offset == hs[0].Offset {
		t.Fatalf("new reservation got the quarantined slot at %d", hd.Offset)
	}
	if err := h.Abort(hd); err != nil {
		t.Fatal(err)
	}
	cancel()
	waitReserved(t, h, 0, 5*time.Second)
}

// TestQuarantineCloseWithoutWait: a daemon stopping with a host arena that
// is not kept releases the entries of live processes at once.
func TestQuarantineCloseWithoutWait(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // after the rig's cleanup
	h, hs, q, _ := quarantineRig(t, 2, time.Minute)
	q.add(uint32(os.Getpid()), hs)
	if r, b := reservedOf(h), q.blocks.Load(); r != 2 || b != 2 {
		t.Fatalf("process alive: %d reserved, %d quarantined; want 2 and 2", r, b)
	}
	closed := make(chan struct{})
	go func() { q.close(false); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close without wait held a live process's reservations")
	}
	if r, b := reservedOf(h), q.blocks.Load(); r != 0 || b != 0 {
		t.Fatalf("after close without wait: %d reserved, %d quarantined; want 0 and 0", r, b)
	}
}
