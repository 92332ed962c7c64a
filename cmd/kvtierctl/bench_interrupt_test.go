package main

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/client"
)

// An interrupted putget bench promises to leave no bench blocks behind
// ("deleted at the end"). Two moments of a Ctrl-C leaked blocks: just
// before a slot's old block was deleted (the slot was marked free before
// the delete, which the interrupt then cancelled) and while a commit was in
// flight (the daemon stored the block, the bench never learnt it and kept
// no note of it). The hook puts the interrupt (or the lost answer) exactly
// there.
func TestBenchInterruptLeavesNoBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon")
	}
	for _, c := range []struct {
		name string
		step string // where the interrupt lands
		lose bool   // the put stored but its answer is lost
	}{
		{"interrupt before a delete", "delete", false},
		{"commit answer lost", "put", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock := startDaemon(t, 64, false)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			n := 0
			putgetHook = func(step string, err error) error {
				if step != c.step {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				if n++; n != 5 {
					return err
				}
				if c.lose && err == nil {
					return errors.New("commit: answer lost")
				}
				cancel() // Ctrl-C, right here
				return err
			}
			defer func() { putgetHook = nil }()
			_, _, err := runCtx(ctx, "bench", "--socket", sock, "--block-size", "64KiB", "--keys", "3",
				"--warmup", "0s", "--duration", "1m")
			if err == nil {
				t.Fatal("interrupted bench exited 0")
			}
			cl, err := client.Dial(context.Background(), client.Options{Socket: sock, Name: "kvtierctl-test"})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			st, err := cl.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if h := hostTier(st); h == nil || h.Blocks != 0 || h.Reserved != 0 || h.Leased != 0 {
				t.Errorf("after the interrupted bench the host tier holds %+v; want no block, reservation or lease", h)
			}
		})
	}
}
