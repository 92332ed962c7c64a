package shm

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeStats(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in        string
		total     int
		malformed bool
	}{
		{name: "total beyond the list", in: `{"namespaces":[{"id":1}],"namespaces_total":3}`, total: 3},
		{name: "older daemon: no total, every namespace listed", in: `{"namespaces":[{"id":1},{"id":2}]}`, total: 2},
		{name: "fewer counted than listed", in: `{"namespaces":[{"id":1},{"id":2}],"namespaces_total":1}`, malformed: true},
		{name: "negative total", in: `{"namespaces_total":-1}`, malformed: true},
		{name: "more than uint32 ids", in: `{"namespaces_total":4294967296}`, malformed: true},
		{name: "not JSON", in: `{"namespaces":`, malformed: true},
		{name: "larger than a control message", in: `{"version":"` + strings.Repeat("x", MaxControlMsg) + `"}`, malformed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := DecodeStats([]byte(tc.in))
			if tc.malformed {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("DecodeStats(%.60q) = %v, want ErrMalformed", tc.in, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.NamespacesTotal != tc.total {
				t.Fatalf("namespaces_total %d, want %d", st.NamespacesTotal, tc.total)
			}
		})
	}
}
