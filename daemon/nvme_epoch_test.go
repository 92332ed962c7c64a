package daemon

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvtier/kvtier/client"
)

// TestNVMeDroppedWithRegistryEpoch: the NVMe tier keys blocks by namespace
// id, and ids are only meaningful within one registry epoch. When the
// registry had to be discarded (a corrupt namespaces.json), the next
// model to register gets the old model's id; blocks the previous daemon
// wrote down to NVMe must then be dropped, not served to the other model
// (token hashes do not depend on the model). A plain restart keeps them,
// also of a store from before the epoch file existed (an upgrade).
func TestNVMeDroppedWithRegistryEpoch(t *testing.T) {
	for _, tc := range []struct {
		name          string
		resetRegistry bool
		noEpochFile   bool // as written by a kvtierd from before nvme.epoch
		wantHit       bool
	}{
		{"same registry", false, false, true},
		{"registry reset", true, false, false},
		{"upgrade, same registry", false, true, true},
		{"upgrade, registry reset", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 64*MiB, true
			ctx := context.Background()
			nsA := testNamespace(64 * KiB)
			nsA.ModelID = "model-a"
			nsB := nsA
			nsB.ModelID = "model-b"

			r := startDaemon(t, cfg, nil)
			c := dialDaemon(t, cfg)
			s, err := c.Open(ctx, nsA)
			if err != nil {
				t.Fatal(err)
			}
			const blocks = 4
			putBlocks(t, s, blocks) // written down to NVMe at stop
			c.Close()
			r.stop(t)

			next := nsA
			if tc.noEpochFile {
				if err := os.Remove(filepath.Join(cfg.StateDir, nvmeEpochFile)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.resetRegistry {
				if err := os.WriteFile(filepath.Join(cfg.StateDir, registryFile), []byte("{garbage"), 0o640); err != nil {
					t.Fatal(err)
				}
				next = nsB // registers first in the new epoch: model-a's old id
			}
			startDaemon(t, cfg, nil)
			c2 := dialDaemon(t, cfg)
			s2, err := c2.Open(ctx, next)
			if err != nil {
				t.Fatal(err)
			}
			dst := make([]byte, s2.BlockBytes())
			for i := range blocks {
				err := s2.Get(ctx, testHash(i), dst)
				switch {
				case err == nil && !tc.wantHit:
					t.Fatalf("block %d of %s served to %s after the registry was reset (first byte %#x)",
						i, nsA.ModelID, next.ModelID, dst[0])
				case err == nil:
					if want := bytes.Repeat([]byte{byte(i + 1)}, len(dst)); !bytes.Equal(dst, want) {
						t.Fatalf("block %d: wrong bytes after restart", i)
					}
				case errors.Is(err, client.ErrNotFound) && tc.wantHit:
					t.Fatalf("block %d lost across a plain restart", i)
				case !errors.Is(err, client.ErrNotFound):
					t.Fatalf("get %d: %v", i, err)
				}
			}
		})
	}
}
