package daemon

import (
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

const exampleConfig = "../systemd/kvtierd.toml"

// configKeys lists every leaf field of Config by dotted TOML name.
func configKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		if prefix != "" {
			name = prefix + "." + name
		}
		if f.Type.Kind() == reflect.Struct {
			keys = append(keys, configKeys(f.Type, name)...)
			continue
		}
		keys = append(keys, name)
	}
	return keys
}

// TestExampleConfig keeps systemd/kvtierd.toml from drifting: the daemon's
// loader accepts it, it sets every Config field, and the values it shows
// are the defaults (those of a daemon started by root, where the two
// differ by user).
func TestExampleConfig(t *testing.T) {
	if _, err := LoadConfig(exampleConfig); err != nil {
		t.Fatalf("LoadConfig(%s): %v", exampleConfig, err)
	}

	var raw Config
	md, err := toml.DecodeFile(exampleConfig, &raw)
	if err != nil {
		t.Fatal(err)
	}
	keys := configKeys(reflect.TypeOf(Config{}), "")
	if len(keys) < 20 {
		t.Fatalf("only %d config keys found: %v", len(keys), keys)
	}
	for _, k := range keys {
		if !md.IsDefined(strings.Split(k, ".")...) {
			t.Errorf("%s does not document %s", exampleConfig, k)
		}
	}

	e := fakeEnv(0, nil, bigMem)
	def, err := e.load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := e.load(exampleConfig, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffConfig(def, ex); len(d) > 0 {
		t.Errorf("%s differs from the defaults in %v", exampleConfig, d)
	}
}
