package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// Labels Prometheus attaches to every scraped series (target labels).
var targetLabels = map[string]bool{"instance": true, "job": true}

var (
	labelMatcher = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)`)
	groupingRE   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	quantileRE   = regexp.MustCompile(`histogram_quantile\(\s*[0-9.]+\s*,\s*sum\s+by\s*\(([^)]*)\)\s*\(\s*rate\(`)
	rateFuncs    = []string{"rate(", "irate(", "increase("}
)

// ref is one metric name in a query, with the family it belongs to.
type ref struct {
	name, fam, suffix string
	start, end        int
}

// refs returns the metric references of expr (outside quoted label values).
func refs(expr string, fams map[string]famInfo) (out []ref, problems []string) {
	types := map[string]dto.MetricType{}
	for n, f := range fams {
		types[n] = f.typ
	}
	for _, loc := range metricRef.FindAllStringIndex(expr, -1) {
		if strings.Count(expr[:loc[0]], `"`)%2 == 1 {
			continue
		}
		name := expr[loc[0]:loc[1]]
		f, ok := family(name, types)
		if !ok {
			problems = append(problems, fmt.Sprintf("%s is not exported", name))
			continue
		}
		out = append(out, ref{name: name, fam: f, suffix: strings.TrimPrefix(name, f), start: loc[0], end: loc[1]})
	}
	return out, problems
}

// checkExpr checks a PromQL expression against the exported families: the
// label names of its selectors and groupings exist, counters (and a
// histogram's or summary's _bucket, _count, _sum) are read through rate or
// increase and gauges are not, and a histogram quantile aggregates its
// buckets by le.
func checkExpr(expr string, fams map[string]famInfo) []string {
	rs, problems := refs(expr, fams)
	known := map[string]bool{}
	for l := range targetLabels {
		known[l] = true
	}
	for _, r := range rs {
		f := fams[r.fam]
		for l := range f.labels {
			known[l] = true
		}
		if r.suffix == "_bucket" {
			known["le"] = true
		}
		// Selector label names.
		if r.end < len(expr) && expr[r.end] == '{' {
			if close := strings.IndexByte(expr[r.end:], '}'); close > 0 {
				sel := expr[r.end+1 : r.end+close]
				for _, m := range labelMatcher.FindAllStringSubmatch(stripQuoted(sel), -1) {
					l := m[1]
					if !f.labels[l] && !targetLabels[l] && !(l == "le" && r.suffix == "_bucket") {
						problems = append(problems, fmt.Sprintf("%s has no label %q", r.fam, l))
					}
				}
			}
		}
		before := strings.TrimRight(expr[:r.start], " ")
		inRate := false
		for _, fn := range rateFuncs {
			if strings.HasSuffix(before, fn) {
				inRate = true
			}
		}
		cumulative := f.typ == dto.MetricType_COUNTER || r.suffix != ""
		switch {
		case cumulative && !inRate:
			problems = append(problems, fmt.Sprintf("%s is cumulative (a %s) but not read through rate/increase", r.name, f.typ))
		case !cumulative && inRate:
			problems = append(problems, fmt.Sprintf("%s is a %s: rate/increase of it means nothing", r.name, f.typ))
		}
		if r.suffix == "_bucket" && !strings.Contains(expr, "histogram_quantile(") {
			problems = append(problems, fmt.Sprintf("%s outside histogram_quantile", r.name))
		}
	}
	for _, m := range groupingRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !known[l] {
				problems = append(problems, fmt.Sprintf("grouping by %q, a label none of the query's families has", l))
			}
		}
	}
	if n := strings.Count(expr, "histogram_quantile("); n > 0 {
		ms := quantileRE.FindAllStringSubmatch(expr, -1)
		if len(ms) != n {
			problems = append(problems, "histogram_quantile not over sum by (le, ...) (rate(..._bucket))")
		}
		for _, m := range ms {
			hasLE := false
			for _, l := range strings.Split(m[1], ",") {
				hasLE = hasLE || strings.TrimSpace(l) == "le"
			}
			if !hasLE {
				problems = append(problems, "histogram_quantile aggregates without le: "+m[0])
			}
		}
	}
	return problems
}

// stripQuoted blanks quoted label values (they may contain anything).
func stripQuoted(s string) string {
	var b strings.Builder
	in := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && in && i+1 < len(s):
			i++
			continue
		case c == '"':
			in = !in
			b.WriteByte(c)
			continue
		}
		if in {
			b.WriteByte(' ')
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// exprUnit is the Grafana unit a single query's result is in, or "" when
// it cannot tell (ratios, mixes).
func exprUnit(expr string, fams map[string]famInfo) string {
	rs, _ := refs(expr, fams)
	if len(rs) == 0 {
		return ""
	}
	if strings.Contains(expr, "histogram_quantile(") {
		for _, r := range rs {
			if !strings.HasSuffix(r.fam, "_seconds") {
				return ""
			}
		}
		return "s"
	}
	if strings.Contains(expr, "/") || len(rs) != 1 {
		return ""
	}
	r := rs[0]
	switch {
	case fams[r.fam].typ == dto.MetricType_COUNTER && strings.HasSuffix(r.fam, "_bytes_total"):
		return "Bps"
	case fams[r.fam].typ == dto.MetricType_GAUGE && strings.HasSuffix(r.fam, "_bytes"):
		return "bytes"
	}
	return ""
}

// unitsAlike treats Grafana's decimal and binary variants as one unit.
func unitsAlike(want, got string) bool {
	switch want {
	case "bytes":
		return got == "bytes" || got == "decbytes"
	case "Bps":
		return got == "Bps" || got == "binBps"
	}
	return want == got
}

// TestDashboardQueriesMatchRegistry checks every dashboard query against
// the families, types and label names of a live daemon's registry, and each
// panel's unit against what its queries return.
func TestDashboardQueriesMatchRegistry(t *testing.T) {
	raw, err := os.ReadFile("kvtier.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	fams := exportedFamilies(t)
	for where, expr := range queries(t, dash) {
		if strings.HasPrefix(where, "variable ") {
			continue // label_values(metric, label): a name, checked by the other test
		}
		for _, p := range checkExpr(expr, fams) {
			t.Errorf("%s: %s (query %s)", where, p, expr)
		}
	}
	var walk func(ps []any)
	walk = func(ps []any) {
		for _, p := range ps {
			pm := p.(map[string]any)
			if sub, ok := pm["panels"].([]any); ok {
				walk(sub)
			}
			targets, _ := pm["targets"].([]any)
			if len(targets) == 0 {
				continue
			}
			unit := ""
			if fc, ok := pm["fieldConfig"].(map[string]any); ok {
				if d, ok := fc["defaults"].(map[string]any); ok {
					unit, _ = d["unit"].(string)
				}
			}
			want := ""
			for i, tg := range targets {
				expr, _ := tg.(map[string]any)["expr"].(string)
				u := exprUnit(expr, fams)
				if i == 0 {
					want = u
				} else if u != want {
					want = "" // mixed: nothing to check
					break
				}
			}
			if want != "" && !unitsAlike(want, unit) {
				t.Errorf("panel %q: unit %q, its queries return %s", pm["title"], unit, want)
			}
		}
	}
	panels, _ := dash["panels"].([]any)
	walk(panels)
}

// TestCheckExpr: the checker finds the mistakes it is there for.
func TestCheckExpr(t *testing.T) {
	fams := map[string]famInfo{
		"kvtier_op_duration_seconds": {typ: dto.MetricType_HISTOGRAM, labels: map[string]bool{"op": true}},
		"kvtier_tier_hits_total":     {typ: dto.MetricType_COUNTER, labels: map[string]bool{"tier": true}},
		"kvtier_moved_bytes_total":   {typ: dto.MetricType_COUNTER, labels: map[string]bool{"from": true, "to": true}},
		"kvtier_sessions":            {typ: dto.MetricType_GAUGE, labels: map[string]bool{}},
		"kvtier_tier_resident_bytes": {typ: dto.MetricType_GAUGE, labels: map[string]bool{"tier": true}},
	}
	for _, tt := range []struct {
		expr string
		bad  bool
		unit string
	}{
		{`histogram_quantile(0.99, sum by (le, op) (rate(kvtier_op_duration_seconds_bucket{instance=~"$instance"}[5m])))`, false, "s"},
		{`histogram_quantile(0.99, sum by (op) (rate(kvtier_op_duration_seconds_bucket[5m])))`, true, "s"},
		{`histogram_quantile(0.99, rate(kvtier_op_duration_seconds_bucket[5m]))`, true, "s"},
		{`sum by (tier) (rate(kvtier_tier_hits_total{tier="host"}[5m]))`, false, ""},
		{`sum by (tier) (kvtier_tier_hits_total)`, true, ""},                       // a counter read raw
		{`sum(rate(kvtier_tier_hits_total{namespace="x"}[5m]))`, true, ""},         // no such label
		{`sum by (kind) (rate(kvtier_tier_hits_total[5m]))`, true, ""},             // grouping by a missing label
		{`rate(kvtier_sessions[5m])`, true, ""},                                    // rate of a gauge
		{`sum(kvtier_sessions{instance=~"$instance"})`, false, ""},                 // target label
		{`sum by (from, to) (rate(kvtier_moved_bytes_total[5m]))`, false, "Bps"},   // bytes per second
		{`sum by (tier) (kvtier_tier_resident_bytes{tier="a=b"})`, false, "bytes"}, // '=' inside a value
		{`sum(rate(kvtier_op_duration_seconds_count[5m]))`, false, ""},
		{`sum(kvtier_op_duration_seconds_count)`, true, ""},
	} {
		ps := checkExpr(tt.expr, fams)
		if (len(ps) > 0) != tt.bad {
			t.Errorf("checkExpr(%s) = %v, want bad=%v", tt.expr, ps, tt.bad)
		}
		if u := exprUnit(tt.expr, fams); u != tt.unit {
			t.Errorf("exprUnit(%s) = %q, want %q", tt.expr, u, tt.unit)
		}
	}
}
