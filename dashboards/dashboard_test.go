// Package dashboards holds the Grafana dashboard for kvtierd (kvtier.json)
// and the test that keeps it honest: every query names a metric family the
// daemon really exports.
package dashboards

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/daemon"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// exported gathers the families of a real daemon's registry (NVMe tier on,
// so its families are present).
func exported(t *testing.T) map[string]dto.MetricType {
	t.Helper()
	out := map[string]dto.MetricType{}
	for name, f := range exportedFamilies(t) {
		out[name] = f.typ
	}
	return out
}

// famInfo is one exported family: its type and the label names its series
// carry.
type famInfo struct {
	typ    dto.MetricType
	labels map[string]bool
}

// exportedFamilies is exported with each family's label names.
func exportedFamilies(t *testing.T) map[string]famInfo {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "kvtd")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg, err := daemon.LoadFromArgs([]string{"-runtime-dir", dir, "-state-dir", filepath.Join(dir, "state"),
		"-host-capacity", "128MiB", "-metrics-listen", "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host.Capacity, cfg.Host.SlabBytes, cfg.Host.Prefault = 8<<20, 4<<20, false
	cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 64<<20
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(20 * time.Second):
			t.Error("daemon did not stop")
		}
	}()
	mfs, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]famInfo{}
	for _, mf := range mfs {
		f := famInfo{typ: mf.GetType(), labels: map[string]bool{}}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				f.labels[lp.GetName()] = true
			}
		}
		out[mf.GetName()] = f
	}
	return out
}

// metricRef matches identifiers of our families (and the Go runtime and
// process collectors') anywhere in a query: before {, (, [, a space or the
// end. Label names and values never start with these prefixes.
var metricRef = regexp.MustCompile(`\b(?:kvtier|go|process)_[A-Za-z0-9_:]*`)

// metricNames returns the metric names a PromQL expression refers to.
func metricNames(expr string) []string {
	var names []string
	for _, loc := range metricRef.FindAllStringIndex(expr, -1) {
		// Skip identifiers inside quoted label values.
		if strings.Count(expr[:loc[0]], `"`)%2 == 1 {
			continue
		}
		names = append(names, expr[loc[0]:loc[1]])
	}
	return names
}

// family maps a sample name to the family that exports it: a histogram or
// summary exports <family>_bucket, _sum and _count.
func family(name string, fams map[string]dto.MetricType) (string, bool) {
	if _, ok := fams[name]; ok {
		return name, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		switch fams[base] {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return base, true
		case dto.MetricType_SUMMARY:
			if suf != "_bucket" {
				return base, true
			}
		}
	}
	return "", false
}

// queries walks the dashboard for every PromQL expression: panel targets
// (rows included) and query variables.
func queries(t *testing.T, dash map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{} // where → expr
	var walkPanels func(ps []any, where string)
	walkPanels = func(ps []any, where string) {
		for _, p := range ps {
			pm := p.(map[string]any)
			title, _ := pm["title"].(string)
			if sub, ok := pm["panels"].([]any); ok {
				walkPanels(sub, where+title+"/")
			}
			if pm["type"] == "row" {
				continue
			}
			targets, _ := pm["targets"].([]any)
			if len(targets) == 0 {
				t.Errorf("panel %q has no query", title)
			}
			for _, tg := range targets {
				tm := tg.(map[string]any)
				expr, _ := tm["expr"].(string)
				if strings.TrimSpace(expr) == "" {
					t.Errorf("panel %q target %v has an empty expr", title, tm["refId"])
				}
				out[where+title+" "+tm["refId"].(string)] = expr
			}
		}
	}
	panels, _ := dash["panels"].([]any)
	walkPanels(panels, "")
	if tmpl, ok := dash["templating"].(map[string]any); ok {
		for _, v := range tmpl["list"].([]any) {
			vm := v.(map[string]any)
			if vm["type"] != "query" {
				continue
			}
			switch q := vm["query"].(type) {
			case string:
				out["variable "+vm["name"].(string)] = q
			case map[string]any:
				out["variable "+vm["name"].(string)], _ = q["query"].(string)
			}
		}
	}
	return out
}

func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("kvtier.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("kvtier.json is not valid JSON: %v", err)
	}
	for _, k := range []string{"title", "uid", "schemaVersion", "panels", "templating"} {
		if dash[k] == nil {
			t.Errorf("dashboard lacks %q", k)
		}
	}
	// The data source is an import input, used by every panel.
	if !strings.Contains(string(raw), `"name": "DS_PROMETHEUS"`) {
		t.Error("no DS_PROMETHEUS input/variable")
	}
	if n := strings.Count(string(raw), `"uid": "${DS_PROMETHEUS}"`); n == 0 {
		t.Error("no panel uses ${DS_PROMETHEUS}")
	}
	ids := map[float64]bool{}
	for _, p := range dash["panels"].([]any) {
		id, _ := p.(map[string]any)["id"].(float64)
		if ids[id] {
			t.Errorf("duplicate panel id %v", id)
		}
		ids[id] = true
	}

	fams := exported(t)
	used := map[string]bool{}
	qs := queries(t, dash)
	if len(qs) == 0 {
		t.Fatal("no queries found")
	}
	for where, expr := range qs {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: query names no kvtier/go/process metric: %s", where, expr)
		}
		for _, n := range names {
			f, ok := family(n, fams)
			if !ok {
				t.Errorf("%s: %s is not exported by kvtierd (query %s)", where, n, expr)
				continue
			}
			used[f] = true
		}
	}
	// The views the dashboard promises.
	for _, f := range []string{
		"kvtier_tier_hits_total", "kvtier_tier_misses_total", "kvtier_tier_resident_bytes", "kvtier_tier_capacity_bytes",
		"kvtier_moved_bytes_total", "kvtier_op_duration_seconds", "kvtier_swap_in_seconds", "kvtier_swap_out_seconds",
		"kvtier_sessions", "kvtier_errors_total",
	} {
		if !used[f] {
			t.Errorf("no panel queries %s", f)
		}
	}
	var unused []string
	for f := range fams {
		if strings.HasPrefix(f, "kvtier_") && !used[f] {
			unused = append(unused, f)
		}
	}
	slices.Sort(unused)
	t.Logf("%d queries, %d families used; kvtier families not on the dashboard: %v", len(qs), len(used), unused)
}

func TestMetricNames(t *testing.T) {
	fams := map[string]dto.MetricType{
		"kvtier_op_duration_seconds": dto.MetricType_HISTOGRAM,
		"go_gc_duration_seconds":     dto.MetricType_SUMMARY,
		"kvtier_sessions":            dto.MetricType_GAUGE,
	}
	expr := `histogram_quantile(0.99, sum by (le, op) (rate(kvtier_op_duration_seconds_bucket{op="kvtier_x"}[5m]))) + kvtier_sessions + rate(go_gc_duration_seconds_count[1m])`
	got := metricNames(expr)
	want := []string{"kvtier_op_duration_seconds_bucket", "kvtier_sessions", "go_gc_duration_seconds_count"}
	if !slices.Equal(got, want) {
		t.Fatalf("metricNames = %v, want %v", got, want)
	}
	for _, tt := range []struct {
		name, fam string
		ok        bool
	}{
		{"kvtier_op_duration_seconds_bucket", "kvtier_op_duration_seconds", true},
		{"kvtier_op_duration_seconds_count", "kvtier_op_duration_seconds", true},
		{"go_gc_duration_seconds_sum", "go_gc_duration_seconds", true},
		{"go_gc_duration_seconds_bucket", "", false}, // a summary has no buckets
		{"kvtier_sessions_count", "", false},         // a gauge has no _count
		{"kvtier_sessions", "kvtier_sessions", true},
		{"kvtier_nope_total", "", false},
	} {
		f, ok := family(tt.name, fams)
		if f != tt.fam || ok != tt.ok {
			t.Errorf("family(%s) = %q, %v; want %q, %v", tt.name, f, ok, tt.fam, tt.ok)
		}
	}
}
