package trace

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzDecodeLine: the decoder never panics, and whatever it accepts is
// valid and survives a Write/DecodeLine round trip unchanged.
func FuzzDecodeLine(f *testing.F) {
	for _, s := range []string{
		`{"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, 2]}`,
		`{"timestamp": 1.5, "hash_ids": []}`,
		`{"timestamp": 1, "hash_ids": [1, 1]}`,
		`{"timestamp": 1e30, "hash_ids": [9223372036854775807]}`,
		`{}`, `[]`, ``, `{"hash_ids": null, "timestamp": null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := DecodeLine(line)
		if err != nil {
			return
		}
		if r.Timestamp < 0 || r.InputLength < 0 || r.OutputLength < 0 || r.HashIDs == nil {
			t.Fatalf("accepted invalid request %+v", r)
		}
		var buf bytes.Buffer
		if err := Write(&buf, []Request{r}); err != nil {
			t.Fatal(err)
		}
		back, err := DecodeLine(buf.Bytes())
		if err != nil || !reflect.DeepEqual(back, r) {
			t.Fatalf("round trip: %+v → %q → %+v, %v", r, buf.Bytes(), back, err)
		}
	})
}
