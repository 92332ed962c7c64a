package trace

import (
	"strings"
	"testing"
)

// TestDecodeLineLengthsAgree: input_length and hash_ids describe the same
// prompt. Replay's prefix hit ratio counts a hit block as BlockTokens
// tokens (the last one as the prompt's remainder) out of input_length, so
// a line whose blocks outrun its input_length, or that has no
// input_length at all, made it count tokens the prompt does not have
// (100 of 100 tokens "served" with 2 of 3 blocks missed) or none at all
// (0 of 0 tokens with every block hit).
func TestDecodeLineLengthsAgree(t *testing.T) {
	for _, c := range []struct {
		line  string
		input int    // the accepted line's InputLength
		err   string // or the error it must name
	}{
		{`{"timestamp": 0, "input_length": 100, "hash_ids": [1, 2, 3]}`, 0, "too short for 3 blocks"},
		{`{"timestamp": 0, "input_length": 1024, "hash_ids": [1, 2, 3]}`, 0, "too short for 3 blocks"},
		{`{"timestamp": 0, "input_length": 0, "hash_ids": [1]}`, 0, "too short for 1 blocks"},
		{`{"timestamp": 0, "input_length": 1025, "hash_ids": [1, 2, 3]}`, 1025, ""}, // last block partial
		{`{"timestamp": 0, "input_length": 1536, "hash_ids": [1, 2, 3]}`, 1536, ""},
		{`{"timestamp": 0, "input_length": 2000, "hash_ids": [1, 2]}`, 2000, ""}, // tokens past the last full block
		{`{"timestamp": 0, "input_length": 300, "hash_ids": []}`, 300, ""},
		{`{"timestamp": 0, "hash_ids": [1, 2, 3]}`, 1536, ""}, // no input_length: the blocks are the prompt
		{`{"timestamp": 0, "hash_ids": []}`, 0, ""},
	} {
		r, err := DecodeLine([]byte(c.line))
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: accepted with input_length %d (err %v); want an error naming %q", c.line, r.InputLength, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.line, err)
		case c.err == "" && r.InputLength != c.input:
			t.Errorf("%s: input_length %d, want %d", c.line, r.InputLength, c.input)
		}
	}
	// More blocks than MaxTokens, without input_length: the error names
	// hash_ids, not an input_length the line does not have.
	n := MaxTokens/BlockTokens + 2
	long := `{"timestamp": 0, "hash_ids": [` + strings.Repeat("0,", int(n-1)) + `0]}`
	if _, err := DecodeLine([]byte(long)); err == nil || !strings.Contains(err.Error(), "hash_ids") || strings.Contains(err.Error(), "input_length") {
		t.Errorf("%d hash_ids without input_length: %v; want an error about hash_ids", n, err)
	}
	// The Reader names the line.
	_, err := ReadAll(strings.NewReader("{\"timestamp\": 0, \"input_length\": 512, \"hash_ids\": [1]}\r\n" +
		"{\"timestamp\": 1, \"input_length\": 100, \"hash_ids\": [1, 2, 3]}\r\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("ReadAll: %v; want an error at line 2", err)
	}
}
