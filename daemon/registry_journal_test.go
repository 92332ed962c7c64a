package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// idBook records every id a registry handed out: an id must never name two
// specs, across reopens and whatever befell the journal in between (a
// reused id serves one model's NVMe blocks to another).
type idBook map[uint32]NamespaceSpec

func (b idBook) register(t *testing.T, r *Registry, spec NamespaceSpec) uint32 {
	t.Helper()
	id, err := r.Register(spec)
	if err != nil {
		t.Fatal(err)
	}
	if prev, ok := b[id]; ok && prev != spec {
		t.Fatalf("id %d handed out again: %s, then %s", id, prev.ModelID, spec.ModelID)
	}
	b[id] = spec
	return id
}

// check: the reopened registry holds no id under another spec than it had.
func (b idBook) check(t *testing.T, r *Registry) {
	t.Helper()
	for id, spec := range r.All() {
		if prev, ok := b[id]; ok && prev != spec {
			t.Fatalf("after reopen id %d is %s, was %s", id, spec.ModelID, prev.ModelID)
		}
	}
}

func reopen(t *testing.T, dir string) *Registry {
	t.Helper()
	r, err := OpenRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRegistryJournalRecovery: what a crash or an older kvtierd can leave
// of the journal never makes an id name two namespaces; what was
// acknowledged on a whole journal line comes back.
func TestRegistryJournalRecovery(t *testing.T) {
	jpath := func(dir string) string { return filepath.Join(dir, journalFile) }
	appendTo := func(t *testing.T, p, s string) {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	// fill registers n specs of model m and returns them in order.
	fill := func(t *testing.T, b idBook, r *Registry, m string, n int) []NamespaceSpec {
		var specs []NamespaceSpec
		for i := range n {
			s := testSpec(fmt.Sprintf("%s-%d", m, i), 0)
			b.register(t, r, s)
			specs = append(specs, s)
		}
		return specs
	}
	for _, tt := range []struct {
		name string
		// harm changes the files of a registry of 10 namespaces (the
		// journal holds ids 2..10); keep reports which must come back.
		harm func(t *testing.T, dir string)
		keep int
	}{
		{"clean", func(*testing.T, string) {}, 10},
		{"torn last line", func(t *testing.T, dir string) {
			appendTo(t, jpath(dir), `{"id":11,"spec":{"model_id":"torn"`)
		}, 10},
		{"whole last line without its newline", func(t *testing.T, dir string) {
			b, _ := json.Marshal(registryRecord{ID: 11, Spec: testSpec("unacknowledged", 0)})
			appendTo(t, jpath(dir), string(b))
		}, 10},
		{"damaged line in the middle", func(t *testing.T, dir string) {
			b, err := os.ReadFile(jpath(dir))
			if err != nil {
				t.Fatal(err)
			}
			// Line 6 is id 6: ids 1..5 stay, 6..10 are lost and must not
			// be handed out again.
			lines := 0
			for i := range b {
				if b[i] == '\n' {
					if lines++; lines == 5 {
						b[i+3] = '#'
						break
					}
				}
			}
			if err := os.WriteFile(jpath(dir), b, 0o640); err != nil {
				t.Fatal(err)
			}
		}, 5},
		{"journal of another epoch", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(jpath(dir))
			var h journalHeader
			first, _, _ := cutLine(b)
			json.Unmarshal(first, &h)
			h.Epoch++
			hb, _ := json.Marshal(h)
			_, rest, _ := cutLine(b)
			os.WriteFile(jpath(dir), append(append(hb, '\n'), rest...), 0o640)
		}, 1},
		{"journal removed", func(t *testing.T, dir string) { os.Remove(jpath(dir)) }, 1},
		{"older kvtierd registered one (it knows no journal)", func(t *testing.T, dir string) {
			p := filepath.Join(dir, registryFile)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			doc, err := decodeRegistry(b)
			if err != nil {
				t.Fatal(err)
			}
			doc.Namespaces = append(doc.Namespaces, registryRecord{ID: doc.NextID, Spec: testSpec("old-daemon", 0)})
			doc.NextID++
			out, _ := json.Marshal(doc)
			if err := os.WriteFile(p, out, 0o640); err != nil {
				t.Fatal(err)
			}
		}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			b := idBook{}
			r := reopen(t, dir)
			specs := fill(t, b, r, "a", 10)
			if _, err := os.Stat(jpath(dir)); err != nil {
				t.Fatalf("no journal after 10 registrations: %v", err)
			}
			tt.harm(t, dir)
			r = reopen(t, dir)
			b.check(t, r)
			for i, s := range specs[:tt.keep] {
				if id, ok := r.bySpec[s]; !ok || b[id] != s {
					t.Errorf("namespace %d (%s) lost", i, s.ModelID)
				}
			}
			// The registry goes on from there, through more compactions
			// and reopens, never reusing an id.
			fill(t, b, r, "b", 150)
			b.check(t, reopen(t, dir))
			r = reopen(t, dir)
			fill(t, b, r, "c", 10)
			b.check(t, reopen(t, dir))
			if got, want := len(reopen(t, dir).All()), len(r.All()); got != want {
				t.Errorf("reopened registry holds %d namespaces, want %d", got, want)
			}
		})
	}
}

// TestRegistryCrashBetweenCompactionSteps: a compaction writes the snapshot,
// then the new journal; a crash in between leaves the old journal, which
// must not be read as extending the new snapshot.
func TestRegistryCrashBetweenCompactionSteps(t *testing.T) {
	dir := t.TempDir()
	b := idBook{}
	r := reopen(t, dir)
	var i int
	// Fill the journal's ids to their end; the next registration compacts.
	for ; r.nextID < r.reserveEnd || i == 0; i++ {
		b.register(t, r, testSpec(fmt.Sprintf("m-%d", i), 0))
	}
	old, err := os.ReadFile(filepath.Join(dir, journalFile))
	if err != nil {
		t.Fatal(err)
	}
	b.register(t, r, testSpec(fmt.Sprintf("m-%d", i), 0)) // compacts
	if err := os.WriteFile(filepath.Join(dir, journalFile), old, 0o640); err != nil {
		t.Fatal(err)
	}
	r = reopen(t, dir)
	b.check(t, r)
	if len(r.All()) != i+1 {
		t.Fatalf("reopened registry holds %d namespaces, want %d", len(r.All()), i+1)
	}
	for j := range 100 {
		b.register(t, r, testSpec(fmt.Sprintf("n-%d", j), 0))
	}
	b.check(t, reopen(t, dir))
}

func cutLine(b []byte) (line, rest []byte, ok bool) {
	for i, c := range b {
		if c == '\n' {
			return b[:i], b[i+1:], true
		}
	}
	return b, nil, false
}
