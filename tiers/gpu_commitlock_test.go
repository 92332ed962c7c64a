//go:build !cuda

package tiers

import (
	"testing"
	"time"
)

// A Delete/DeleteNS holds tmu through its whole sweep, NVMe step included
// (Chain.DeleteNS → nvme.Store.DeleteNS flushes a write batch; the test
// holds tmu to stand for it). commitCopy takes gs.mu before tmu, so a copy
// committing meanwhile holds gs.mu while it waits: GPUSet.Reserve, which a
// session's ring loop calls for every put, then waits for the delete too,
// although it never needs tmu.
func TestGPUReserveNotBlockedByCommitWaitingForDelete(t *testing.T) {
	r := newGPURig(t, false)
	g0 := r.gs.GPUs[0]
	k1, k2 := chainKey(64, 1), chainKey(64, 2)
	if at := r.put(t, k1, 0); at != g0.Slots {
		t.Fatal("put did not land on GPU 0")
	}
	atCommit, proceed := make(chan struct{}), make(chan struct{})
	r.gs.copied = func(k Key) {
		if k == k1 {
			close(atCommit)
			<-proceed
		}
	}
	demoted := make(chan struct{})
	go func() { // the demoter's copy of k1 to the host tier
		r.gs.demoteBatch(g0, 8)
		close(demoted)
	}()
	<-atCommit
	r.gs.tmu.Lock() // a Delete of another key, in its NVMe step
	close(proceed)
	waitFor(t, "the copy to wait at its commit", func() bool { return inFrame("tiers.(*GPUSet).commitCopy(") })
	time.Sleep(50 * time.Millisecond) // let it block on the lock it waits for
	type res struct {
		hd  *Handle
		err error
	}
	rc := make(chan res, 1)
	go func() {
		hd, err := r.gs.Reserve(k2, gpuBlock, 0)
		rc <- res{hd, err}
	}()
	var x res
	select {
	case x = <-rc:
	case <-time.After(2 * time.Second):
		r.gs.tmu.Unlock()
		<-demoted
		x = <-rc
		if x.err == nil {
			x.hd.Owner().Abort(x.hd)
		}
		t.Fatal("GPUSet.Reserve of an unrelated key waited for a Delete (it held no lock the Delete holds)")
	}
	r.gs.tmu.Unlock()
	<-demoted
	if x.err != nil {
		t.Fatalf("reserve: %v", x.err)
	}
	x.hd.Owner().Abort(x.hd)
}
