package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestRegistryNewerVersionRefused: a namespaces.json written by a newer
// kvtierd (an operator's downgrade) must be refused and left in place,
// whatever that version added: its ids are still the NVMe tier's. A newer
// format most likely adds a field or changes one's type, which the strict
// decode of this version's fields rejected before the version was looked
// at, so the file was taken for corrupt: moved aside, the registry started
// anew with a new epoch, and the NVMe tier dropped with it.
func TestRegistryNewerVersionRefused(t *testing.T) {
	for _, tt := range []struct{ name, body string }{
		{"same fields", `{"version":2,"epoch":5,"next_id":2,"namespaces":[{"id":1,"spec":{"model_id":"m","layers":1,"kv_heads":1,"head_dim":1,"dtype":"fp16","tokens_per_block":1,"tp_rank":0,"tp_size":1,"block_bytes":1}}]}`},
		{"new top-level field", `{"version":2,"epoch":5,"next_id":2,"generation":7,"namespaces":[]}`},
		{"new spec field", `{"version":2,"epoch":5,"next_id":2,"namespaces":[{"id":1,"spec":{"model_id":"m","layers":1,"kv_heads":1,"head_dim":1,"dtype":"fp16","tokens_per_block":1,"tp_rank":0,"tp_size":1,"block_bytes":1,"kv_layout":"nhd"}}]}`},
		{"field of another type", `{"version":2,"epoch":"5-a","next_id":2,"namespaces":{}}`},
		{"version after the other fields", `{"epoch":5,"next_id":2,"namespaces":[],"extra":[1,2],"version":3}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, registryFile)
			if err := os.WriteFile(p, []byte(tt.body), 0o640); err != nil {
				t.Fatal(err)
			}
			r, err := OpenRegistry(dir)
			if !errors.Is(err, errRegistryVersion) {
				epoch := uint64(0)
				if r != nil {
					epoch = r.Epoch()
				}
				t.Errorf("OpenRegistry = epoch %#x, err %v; want the newer version refused (errRegistryVersion)", epoch, err)
			}
			if b, err := os.ReadFile(p); err != nil || string(b) != tt.body {
				t.Errorf("the newer version's file was not left in place: %v", err)
			}
			if aside, _ := filepath.Glob(p + ".corrupt-*"); len(aside) != 0 {
				t.Errorf("the newer version's file was moved aside as corrupt: %v", aside)
			}
		})
	}
}
