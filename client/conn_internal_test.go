package client

import (
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
)

func TestSpinBudget(t *testing.T) {
	for _, tt := range []struct {
		spin    time.Duration
		crowded bool
		want    time.Duration
	}{
		{50 * time.Microsecond, false, 50 * time.Microsecond},
		{50 * time.Microsecond, true, time.Millisecond},
		{200 * time.Microsecond, true, 4 * time.Millisecond},
		{-1, true, -20}, // a negative Spin (no polling) stays negative
	} {
		if got := spinBudget(tt.spin, tt.crowded); got != tt.want {
			t.Errorf("spinBudget(%v, %v) = %v, want %v", tt.spin, tt.crowded, got, tt.want)
		}
	}
}

// TestPushLazy covers both outcomes of a lazy push against a real ring with
// the daemon's side driven here: while the loop polls, the entry needs no
// doorbell and no timer is armed; once the loop has announced a sleep, the
// bell timer is armed and wakes it.
func TestPushLazy(t *testing.T) {
	l := shm.RingLayout{Entries: 16, DataSize: 4096}
	mem := make([]byte, l.Size())
	daemon, err := shm.NewRing(mem, l, true)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := shm.NewRing(mem, l, false)
	if err != nil {
		t.Fatal(err)
	}
	cn := &conn{ring: ring}
	cn.refs.Store(1)
	cn.bell = time.AfterFunc(time.Hour, cn.ringLazy)
	cn.bell.Stop()
	defer cn.bell.Stop()
	rel := []shm.SQE{{Op: shm.OpRelease, Token: 7}}
	var got [4]shm.SQE

	// Polling loop: nothing armed, and the entry is there to pop.
	if err := cn.pushLazy(rel); err != nil {
		t.Fatal(err)
	}
	if u, a := cn.state(); u || a {
		t.Fatalf("push to a polling loop left unrung=%v armed=%v", u, a)
	}
	if n, err := daemon.DaemonPop(got[:]); n != 1 || err != nil || got[0].Token != 7 {
		t.Fatalf("pop: %d %v %+v", n, err, got[0])
	}

	// Sleeping loop: the timer must ring it well before its own bound.
	woke := make(chan time.Duration, 1)
	go func() {
		t0 := time.Now()
		daemon.DaemonWait(0, 10*time.Second)
		woke <- time.Since(t0)
	}()
	for !ring.ClientNeedsWake() {
		time.Sleep(100 * time.Microsecond)
	}
	if err := cn.pushLazy(rel); err != nil {
		t.Fatal(err)
	}
	if !cn.bellArmed.Load() {
		t.Fatal("push to a sleeping loop armed no bell")
	}
	select {
	case d := <-woke:
		t.Logf("sleeping loop woken after %v", d)
	case <-time.After(5 * time.Second):
		t.Fatal("the bell never woke the sleeping loop")
	}
	if n, err := daemon.DaemonPop(got[:]); n != 1 || err != nil || got[0].Token != 7 {
		t.Fatalf("pop after wake: %d %v %+v", n, err, got[0])
	}
	if u, a := cn.state(); u || a {
		t.Fatalf("after the bell: unrung=%v armed=%v", u, a)
	}
}

// state reads the lazy-bell flags under the lock that guards unrung.
func (cn *conn) state() (unrung, armed bool) {
	cn.sqMu.Lock()
	defer cn.sqMu.Unlock()
	return cn.unrung, cn.bellArmed.Load()
}
