package trace

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeLine(t *testing.T) {
	for _, c := range []struct {
		line string
		want Request
		err  string
	}{
		{`{"timestamp": 5, "input_length": 1024, "output_length": 3, "hash_ids": [0, 1]}`, Request{Timestamp: 5, InputLength: 1024, OutputLength: 3, HashIDs: []int64{0, 1}}, ""},
		{`{"timestamp": 5.7, "hash_ids": [], "extra": {"x": 1}}`, Request{Timestamp: 5, HashIDs: []int64{}}, ""},
		{`   `, Request{}, "empty line"},
		{`{"hash_ids": [1]}`, Request{}, "missing \"timestamp\""},
		{`{"timestamp": 1}`, Request{}, "missing \"hash_ids\""},
		{`{"timestamp": -1, "hash_ids": []}`, Request{}, "negative timestamp"},
		{`{"timestamp": 1, "hash_ids": [1, -2]}`, Request{}, "negative"},
		{`{"timestamp": 1, "hash_ids": [1, 2, 1]}`, Request{}, "repeats"},
		{`{"timestamp": 1, "hash_ids": [1.5]}`, Request{}, "bad JSON"},
		{`{"timestamp": 1, "hash_ids": [1]} {}`, Request{}, "trailing"},
		{`{"timestamp": 1, "input_length": -3, "hash_ids": [1]}`, Request{}, "negative length"},
		{`{"timestamp": 1, "input_length": 4294967297, "hash_ids": [1]}`, Request{}, "above"},
		{`{"timestamp": 1, "output_length": 4611686018427387904, "hash_ids": [1]}`, Request{}, "above"},
		{`[1,2]`, Request{}, "bad JSON"},
		{`{"timestamp": "x", "hash_ids": [1]}`, Request{}, "bad JSON"},
	} {
		got, err := DecodeLine([]byte(c.line))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err = %v, want %q", c.line, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %+v, %v; want %+v", c.line, got, err, c.want)
		}
	}
}

func TestReaderLineNumbers(t *testing.T) {
	in := "{\"timestamp\":0,\"hash_ids\":[1]}\n\n{\"timestamp\":1,\"hash_ids\":[1,2]}\n{oops}\n"
	r := NewReader(strings.NewReader(in))
	for _, line := range []int{1, 3} { // the blank line 2 is skipped, but counted
		req, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if req.Line != line {
			t.Fatalf("request at line %d says line %d", line, req.Line)
		}
	}
	_, err := r.Next()
	var le *LineError
	if !errors.As(err, &le) || le.Line != 4 || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("err = %v, want a LineError at line 4", err)
	}
	// No trailing newline, then EOF.
	r = NewReader(strings.NewReader(`{"timestamp":0,"hash_ids":[1]}`))
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("err = %v, want EOF", err)
	}
}

func TestReaderLongLine(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"timestamp":0,"hash_ids":[`)
	for i := range 100000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("1234567")
		b.WriteString(string(rune('0' + i%10)))
	}
	// Ids repeat (i%10): expect the duplicate error, proving the long
	// line (>64 KiB, the bufio size) was assembled and decoded.
	b.WriteString("]}\n")
	_, err := NewReader(strings.NewReader(b.String())).Next()
	if err == nil || !strings.Contains(err.Error(), "repeats") {
		t.Fatalf("err = %v", err)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	for _, gen := range []func(uint64, int) []Request{Chat, Docs, Mixed} {
		reqs := gen(3, 300)
		var buf bytes.Buffer
		if err := Write(&buf, reqs); err != nil {
			t.Fatal(err)
		}
		back, err := ReadAll(&buf)
		if err != nil {
			t.Fatal(err)
		}
		for i := range back {
			if back[i].Line != i+1 {
				t.Fatalf("request %d read from line %d", i, back[i].Line)
			}
			back[i].Line = 0 // not written
		}
		if !reflect.DeepEqual(back, reqs) {
			t.Fatal("round trip changed the trace")
		}
	}
}

func TestGenerators(t *testing.T) {
	for name, gen := range map[string]func(uint64, int) []Request{"chat": Chat, "docs": Docs, "mixed": Mixed} {
		a, b, c := gen(1, 2000), gen(1, 2000), gen(2, 2000)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: not deterministic for a seed", name)
		}
		if reflect.DeepEqual(a, c) {
			t.Errorf("%s: seed ignored", name)
		}
		if len(a) < 1990 || len(a) > 2000 {
			t.Errorf("%s: %d requests, want ~2000", name, len(a))
		}
		// Sorted by time, valid lines, and prefix-chained: an id always
		// follows the same parent.
		parent := map[int64]int64{}
		for i, r := range a {
			if i > 0 && r.Timestamp < a[i-1].Timestamp {
				t.Fatalf("%s: not sorted at %d", name, i)
			}
			var buf bytes.Buffer
			if err := Write(&buf, []Request{r}); err != nil {
				t.Fatal(err)
			}
			if _, err := DecodeLine(buf.Bytes()); err != nil {
				t.Fatalf("%s: request %d invalid: %v", name, i, err)
			}
			prev := int64(-1)
			for _, id := range r.HashIDs {
				if p, ok := parent[id]; ok && p != prev {
					t.Fatalf("%s: id %d has parents %d and %d", name, id, p, prev)
				}
				parent[id] = prev
				prev = id
			}
		}
		s := Summarize(a)
		t.Logf("%s: %+v", name, s)
		if s.InfiniteHit <= 0.05 || s.InfiniteHit >= 0.99 {
			t.Errorf("%s: implausible infinite-cache hit ratio %.3f", name, s.InfiniteHit)
		}
	}
}

func TestSplitAndSummarize(t *testing.T) {
	reqs := []Request{{HashIDs: []int64{1, 2}}, {HashIDs: []int64{1, 3}}, {Timestamp: 9, HashIDs: []int64{1, 2}}}
	a, b := Split(reqs)
	if len(a) != 1 || len(b) != 2 || cap(a) != 1 {
		t.Fatalf("Split: %d, %d", len(a), len(b))
	}
	s := Summarize(reqs)
	want := Stats{Requests: 3, BlockRefs: 6, DistinctBlocks: 3, OnceBlocks: 1, InfiniteHit: 3.0 / 6, DurationMs: 9}
	if s != want {
		t.Fatalf("Summarize = %+v, want %+v", s, want)
	}
}
