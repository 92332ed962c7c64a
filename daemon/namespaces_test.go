package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/tiers"
)

func testSpec(model string, rank uint32) NamespaceSpec {
	return NamespaceSpec{
		ModelID: model, Layers: 32, KVHeads: 8, HeadDim: 128, DType: "bf16",
		TokensPerBlock: 16, TPRank: rank, TPSize: 2, BlockBytes: 2 << 20,
	}
}

func TestNamespaceSpecValidate(t *testing.T) {
	tests := []struct {
		name  string
		mut   func(*NamespaceSpec)
		field string // "" means valid
	}{
		{"ok", func(*NamespaceSpec) {}, ""},
		{"utf8 model", func(s *NamespaceSpec) { s.ModelID = "org/modèle-7B" }, ""},
		{"empty model", func(s *NamespaceSpec) { s.ModelID = "" }, "model_id"},
		{"long model", func(s *NamespaceSpec) { s.ModelID = strings.Repeat("m", 257) }, "model_id"},
		{"max model", func(s *NamespaceSpec) { s.ModelID = strings.Repeat("m", 256) }, ""},
		{"control char", func(s *NamespaceSpec) { s.ModelID = "a\nb" }, "model_id"},
		{"bad utf8", func(s *NamespaceSpec) { s.ModelID = "a\xffb" }, "model_id"},
		{"layers", func(s *NamespaceSpec) { s.Layers = 0 }, "layers"},
		{"kv heads", func(s *NamespaceSpec) { s.KVHeads = 0 }, "kv_heads"},
		{"head dim", func(s *NamespaceSpec) { s.HeadDim = 0 }, "head_dim"},
		{"tokens", func(s *NamespaceSpec) { s.TokensPerBlock = 0 }, "tokens_per_block"},
		{"tp size", func(s *NamespaceSpec) { s.TPSize, s.TPRank = 0, 0 }, "tp_size"},
		{"tp rank", func(s *NamespaceSpec) { s.TPRank = 2 }, "tp_rank"},
		{"dtype", func(s *NamespaceSpec) { s.DType = "float16" }, "dtype"},
		{"dtype case", func(s *NamespaceSpec) { s.DType = "BF16" }, "dtype"},
		{"fp8", func(s *NamespaceSpec) { s.DType = "fp8_e4m3" }, ""},
		{"block zero", func(s *NamespaceSpec) { s.BlockBytes = 0 }, "block_bytes"},
		{"block too big", func(s *NamespaceSpec) { s.BlockBytes = 1<<30 + 1 }, "block_bytes"},
		{"block 1", func(s *NamespaceSpec) { s.BlockBytes = 1 }, ""},
		{"block 1GiB", func(s *NamespaceSpec) { s.BlockBytes = 1 << 30 }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSpec("meta-llama/Llama-3-8B", 0)
			tt.mut(&s)
			err := s.Validate()
			switch {
			case tt.field == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.field != "" && (err == nil || !strings.Contains(err.Error(), tt.field)):
				t.Errorf("err = %v, want one naming %s", err, tt.field)
			}
		})
	}
}

func TestRegistryStableAcrossReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "nested") // OpenRegistry creates it
	r, err := OpenRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("state dir mode = %v, %v; want 0750", fi.Mode().Perm(), err)
	}
	a, b := testSpec("m", 0), testSpec("m", 1)
	ida, err := r.Register(a)
	if err != nil || ida != 1 {
		t.Fatalf("first id = %d, %v; want 1", ida, err)
	}
	idb, _ := r.Register(b)
	if idb != 2 {
		t.Errorf("second id = %d, want 2", idb)
	}
	if again, _ := r.Register(a); again != ida {
		t.Errorf("re-register = %d, want %d", again, ida)
	}
	epoch := r.Epoch()
	if epoch == 0 {
		t.Error("epoch is 0")
	}

	r2, err := OpenRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Epoch() != epoch {
		t.Errorf("epoch changed across reopen: %x -> %x", epoch, r2.Epoch())
	}
	if id, _ := r2.Register(b); id != idb {
		t.Errorf("after reopen id = %d, want %d", id, idb)
	}
	if s, ok := r2.Lookup(ida); !ok || s != a {
		t.Errorf("Lookup(%d) = %+v, %v", ida, s, ok)
	}
	if _, ok := r2.Lookup(99); ok {
		t.Error("Lookup(99) found")
	}
	if id, _ := r2.Register(testSpec("other", 0)); id != 3 {
		t.Errorf("new id after reopen = %d, want 3", id)
	}
	all := r2.All()
	if len(all) != 3 || all[1] != a || all[2] != b {
		t.Errorf("All = %+v", all)
	}
	all[1] = b // a copy: must not affect the registry
	if s, _ := r2.Lookup(1); s != a {
		t.Error("All returned the internal map")
	}
	if fi, err := os.Stat(filepath.Join(dir, "namespaces.json")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("file mode = %v, %v", fi, err)
	}
	if tmps, _ := filepath.Glob(filepath.Join(dir, "*.tmp-*")); len(tmps) != 0 {
		t.Errorf("temp files left: %v", tmps)
	}
}

func TestRegistryRejectsInvalid(t *testing.T) {
	r, err := OpenRegistry(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bad := testSpec("m", 0)
	bad.DType = "fp64"
	if _, err := r.Register(bad); err == nil || !strings.Contains(err.Error(), "dtype") {
		t.Errorf("err = %v", err)
	}
	if len(r.All()) != 0 {
		t.Error("invalid spec was registered")
	}
}

func TestRegistryConcurrent(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	const specs, workers = 20, 8
	ids := make([][specs]uint32, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range specs {
				j := (i + w*3) % specs // different orders per worker
				id, err := r.Register(testSpec(fmt.Sprintf("model-%d", j), 0))
				if err != nil {
					t.Error(err)
					return
				}
				ids[w][j] = id
				r.Lookup(id)
				r.All()
			}
		}()
	}
	wg.Wait()
	seen := map[uint32]bool{}
	for j := range specs {
		id := ids[0][j]
		for w := range workers {
			if ids[w][j] != id {
				t.Fatalf("spec %d got ids %d and %d", j, id, ids[w][j])
			}
		}
		if id < 1 || id > specs || seen[id] {
			t.Fatalf("id %d out of range or duplicated", id)
		}
		seen[id] = true
	}
	r2, err := OpenRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	for j := range specs {
		if s, ok := r2.Lookup(ids[0][j]); !ok || s.ModelID != fmt.Sprintf("model-%d", j) {
			t.Errorf("after reopen id %d = %+v, %v", ids[0][j], s, ok)
		}
	}
}

func TestRegistryCorruptFile(t *testing.T) {
	valid := `{"version":1,"epoch":5,"next_id":2,"namespaces":[{"id":1,"spec":{"model_id":"m","layers":1,"kv_heads":1,"head_dim":1,"dtype":"fp16","tokens_per_block":1,"tp_rank":0,"tp_size":1,"block_bytes":1}}]}`
	for _, tt := range []struct{ name, body string }{
		{"garbage", "{not json"},
		{"truncated", valid[:len(valid)/2]},
		{"empty", ""},
		{"unknown field", `{"version":1,"epoch":5,"next_id":1,"namespaces":[],"extra":1}`},
		{"id zero", strings.Replace(valid, `"id":1`, `"id":0`, 1)},
		{"id beyond next", strings.Replace(valid, `"next_id":2`, `"next_id":1`, 1)},
		{"invalid spec", strings.Replace(valid, `"fp16"`, `"fp64"`, 1)},
		{"no epoch", strings.Replace(valid, `"epoch":5`, `"epoch":0`, 1)},
		{"duplicate", strings.Replace(valid, `}}]}`, `}},{"id":1,"spec":{}}]}`, 1)},
		// An id with the parked bit would make the model's blocks look parked.
		{"next id past the parked bit", strings.Replace(strings.Replace(valid, `"next_id":2`, `"next_id":2147483650`, 1), `"id":1`, `"id":2147483649`, 1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "namespaces.json")
			if err := os.WriteFile(p, []byte(tt.body), 0o640); err != nil {
				t.Fatal(err)
			}
			r, err := OpenRegistry(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.All()) != 0 || r.Epoch() == 5 || r.Epoch() == 0 {
				t.Errorf("not started empty with a new epoch: %v, epoch %d", r.All(), r.Epoch())
			}
			aside, _ := filepath.Glob(p + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("corrupt file not moved aside: %v", aside)
			}
			if b, _ := os.ReadFile(aside[0]); string(b) != tt.body {
				t.Error("moved-aside file altered")
			}
			if id, err := r.Register(testSpec("m", 0)); err != nil || id != 1 {
				t.Errorf("Register after reset = %d, %v", id, err)
			}
		})
	}

	t.Run("valid loads", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "namespaces.json"), []byte(valid), 0o640); err != nil {
			t.Fatal(err)
		}
		r, err := OpenRegistry(dir)
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := r.Lookup(1); !ok || s.ModelID != "m" || r.Epoch() != 5 {
			t.Errorf("Lookup(1) = %+v, %v, epoch %d", s, ok, r.Epoch())
		}
	})

	t.Run("newer version refused", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, "namespaces.json")
		if err := os.WriteFile(p, []byte(strings.Replace(valid, `"version":1`, `"version":2`, 1)), 0o640); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenRegistry(dir); err == nil || !strings.Contains(err.Error(), "version") {
			t.Errorf("err = %v, want version error", err)
		}
		if _, err := os.Stat(p); err != nil {
			t.Error("newer-version file was moved")
		}
	})

	t.Run("stale temp removed", func(t *testing.T) {
		dir := t.TempDir()
		stale := filepath.Join(dir, "namespaces.json.tmp-123")
		if err := os.WriteFile(stale, []byte("x"), 0o640); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenRegistry(dir); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(stale); !os.IsNotExist(err) {
			t.Error("stale temp file kept")
		}
	})
}

// FuzzDecodeRegistry: whatever the file holds, an accepted registry has
// unique valid specs under unique ids in [1, next_id), no id with the
// parked bit, and survives a round trip through its JSON form unchanged.
func FuzzDecodeRegistry(f *testing.F) {
	doc := registryDoc{Version: registryVersion, Epoch: 5, NextID: 3, Namespaces: []registryRecord{
		{ID: 1, Spec: testSpec("m", 0)}, {ID: 2, Spec: testSpec("m", 1)}}}
	b, err := json.Marshal(doc)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"version":1,"epoch":5,"next_id":4294967295,"namespaces":[]}`))
	f.Add([]byte(`{"version":1,"epoch":5,"next_id":2147483648,"namespaces":[{"id":2147483647,"spec":{}}]}`))
	f.Add([]byte(`{"version":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := decodeRegistry(data)
		if err != nil {
			return
		}
		if doc.NextID == 0 || doc.NextID > maxNamespaceID+1 || doc.Epoch == 0 {
			t.Fatalf("accepted next_id %d, epoch %d", doc.NextID, doc.Epoch)
		}
		ids := map[uint32]bool{}
		specs := map[NamespaceSpec]bool{}
		for _, rec := range doc.Namespaces {
			if rec.ID == 0 || rec.ID >= doc.NextID || rec.ID&tiers.ParkedNS != 0 || ids[rec.ID] || specs[rec.Spec] {
				t.Fatalf("accepted id %d (next_id %d, seen %v) for %+v", rec.ID, doc.NextID, ids[rec.ID], rec.Spec)
			}
			if err := rec.Spec.Validate(); err != nil {
				t.Fatalf("accepted invalid spec %+v: %v", rec.Spec, err)
			}
			ids[rec.ID], specs[rec.Spec] = true, true
		}
		again, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		doc2, err := decodeRegistry(again)
		if err != nil {
			t.Fatalf("re-encoded registry refused: %v\n%s", err, again)
		}
		if !reflect.DeepEqual(doc, doc2) {
			t.Fatalf("round trip changed the registry:\n%+v\n%+v", doc, doc2)
		}
	})
}
