package client_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/kvtier/kvtier/client"
)

// A call whose context has already ended does nothing: it used to push its
// entries anyway, so a Delete deleted, a Put stored and a Park parked, while
// the call reported context.Canceled (or success, when the answer came
// within its first polls).
func TestCallWithEndedContextDoesNothing(t *testing.T) {
	_, s := openSession(t)
	bg := context.Background()
	bs := s.BlockBytes()
	block := func(b byte) []byte { return bytes.Repeat([]byte{b}, bs) }
	cached := func(h client.Hash) bool {
		t.Helper()
		r, err := s.Lookup(bg, []client.Hash{h})
		if err != nil {
			t.Fatal(err)
		}
		return r.Hits == 1
	}
	stored := client.Hash{Lo: 1}
	if _, err := s.Put(bg, stored, block(1)); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(bg)
	cancel()

	for _, tc := range []struct {
		name  string
		call  func(ctx context.Context) error
		check func() string // the call's effect, if any ("" if none)
	}{
		{"Nop", func(ctx context.Context) error { return s.Nop(ctx) }, nil},
		{"Delete", func(ctx context.Context) error { _, err := s.Delete(ctx, stored); return err },
			func() string {
				if !cached(stored) {
					return "the block was deleted"
				}
				return ""
			}},
		{"Put", func(ctx context.Context) error { _, err := s.Put(ctx, client.Hash{Lo: 2}, block(2)); return err },
			func() string {
				if cached(client.Hash{Lo: 2}) {
					return "the block was stored"
				}
				return ""
			}},
		{"Commit", func(ctx context.Context) error {
			r, err := s.Reserve(bg, client.Hash{Lo: 3})
			if err != nil || r == nil {
				t.Fatalf("reserve: %v, %v", r, err)
			}
			copy(r.Bytes(), block(3))
			return r.Commit(ctx)
		}, func() string {
			if cached(client.Hash{Lo: 3}) {
				return "the block was committed"
			}
			return ""
		}},
		{"Park", func(ctx context.Context) error { return s.Park(ctx, 77, [][]byte{block(4)}) },
			func() string {
				if n, err := s.Unpark(bg, 77, 1); err != nil || n != 0 {
					return "the request was parked"
				}
				return ""
			}},
		{"Get", func(ctx context.Context) error { return s.Get(ctx, stored, make([]byte, bs)) }, nil},
		{"Lookup", func(ctx context.Context) error { _, err := s.Lookup(ctx, []client.Hash{stored}); return err }, nil},
	} {
		err := tc.call(ended)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with an ended context: %v, want context.Canceled", tc.name, err)
		}
		if tc.check != nil {
			if what := tc.check(); what != "" {
				t.Errorf("%s with an ended context: %s", tc.name, what)
			}
		}
	}
	// The session still works, and a reservation given back is free again.
	if _, err := s.Put(bg, client.Hash{Lo: 3}, block(3)); err != nil || !cached(client.Hash{Lo: 3}) {
		t.Fatalf("put after the ended calls: %v", err)
	}
}
