// Package trace reads and generates KV-cache request traces in the Mooncake
// format (FAST'25, "Mooncake: Trading More Storage for Less Computation").
//
// A trace is JSON Lines, one request per line:
//
//	{"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, 2, ...]}
//
// timestamp is the arrival time in milliseconds from the start of the trace,
// input_length and output_length are prompt and generated tokens, and
// hash_ids are the prompt's blocks (BlockTokens tokens each) as prefix-chained
// ids: two requests share a leading run of ids exactly when they share that
// prompt prefix. Unknown fields are ignored, so traces carrying extra
// metadata still load.
//
// Reader streams a trace with constant memory per line and reports bad input
// with its line number; DecodeLine is the single-line decoder (fuzzed).
// The generators in gen.go produce seeded synthetic traces of different
// shapes (multi-turn chat, Zipf-popular shared documents, scans) so that
// replacement policies can be validated on more than one workload.
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// BlockTokens is the number of prompt tokens per block in the Mooncake format.
const BlockTokens = 512

// MaxLineBytes bounds one line of input (a request with ~10M blocks); longer
// lines are rejected instead of being buffered without limit.
const MaxLineBytes = 64 << 20

// MaxTokens bounds input_length and output_length. No model's context
// comes near it; a larger claim is bad input, and with this bound the token
// sums of a replay (uint64) cannot wrap short of 2^32 lines.
const MaxTokens int64 = 1 << 32

// Request is one line of a trace.
type Request struct {
	Timestamp    int64   `json:"timestamp"`     // arrival, ms from trace start
	InputLength  int     `json:"input_length"`  // prompt tokens
	OutputLength int     `json:"output_length"` // generated tokens
	HashIDs      []int64 `json:"hash_ids"`      // prefix-chained block ids of the prompt
	// Line is the request's 1-based line in the input Reader read it
	// from (blank lines count); 0 for a request not read by a Reader.
	Line int `json:"-"`
}

// ErrEmptyLine is returned by DecodeLine for a line holding only white space.
// Reader skips such lines.
var ErrEmptyLine = errors.New("trace: empty line")

// LineError reports bad input at a given line (1-based).
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("trace: line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// DecodeLine decodes one JSON line into a Request and validates it:
// timestamp, lengths and ids must be non-negative, lengths at most
// MaxTokens, hash_ids must be present
// (it may be empty) and no id may repeat within a request (a chain cannot
// contain its own prefix block twice). The blocks may not outrun the
// prompt: every block but the last must be full, so input_length exceeds
// (len(hash_ids)-1)×BlockTokens (a prompt may have tokens past its last
// block, as in traces that hash only full blocks). A line without
// input_length has len(hash_ids)×BlockTokens prompt tokens. Unknown fields
// are ignored.
func DecodeLine(line []byte) (Request, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return Request{}, ErrEmptyLine
	}
	var raw struct {
		Timestamp    *json.Number `json:"timestamp"`
		InputLength  *int         `json:"input_length"`
		OutputLength int          `json:"output_length"`
		HashIDs      *[]int64     `json:"hash_ids"`
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return Request{}, fmt.Errorf("bad JSON: %w", err)
	}
	if dec.More() {
		return Request{}, errors.New("trailing data after the JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return Request{}, errors.New("trailing data after the JSON object")
	}
	var r Request
	if raw.Timestamp == nil {
		return r, errors.New(`missing "timestamp"`)
	}
	ts, err := raw.Timestamp.Int64()
	if err != nil {
		// Some traces write fractional milliseconds; keep the integer part.
		f, ferr := raw.Timestamp.Float64()
		if ferr != nil || f != f || f > 1<<62 || f < -(1<<62) {
			return r, fmt.Errorf("bad timestamp %q", raw.Timestamp.String())
		}
		ts = int64(f)
	}
	if ts < 0 {
		return r, fmt.Errorf("negative timestamp %d", ts)
	}
	if raw.HashIDs == nil {
		return r, errors.New(`missing "hash_ids"`)
	}
	ids := *raw.HashIDs
	if int64(len(ids)) > MaxTokens/BlockTokens+1 {
		return r, fmt.Errorf("%d hash_ids: more blocks than %d tokens", len(ids), MaxTokens)
	}
	// Without input_length the blocks are the prompt: replay's prefix hit
	// ratio (tokens served / prompt tokens) would otherwise be 0 of 0.
	in := len(ids) * BlockTokens
	if raw.InputLength != nil {
		in = *raw.InputLength
	}
	if in < 0 || raw.OutputLength < 0 {
		return r, fmt.Errorf("negative length (input %d, output %d)", in, raw.OutputLength)
	}
	if int64(in) > MaxTokens || int64(raw.OutputLength) > MaxTokens {
		return r, fmt.Errorf("input_length %d or output_length %d above %d tokens", in, raw.OutputLength, MaxTokens)
	}
	// A block past the prompt's end holds no token: the prompt's served
	// tokens (replay counts a hit block as 512, the last one as the rest)
	// would count tokens the prompt does not have.
	if len(ids) > 0 && in <= (len(ids)-1)*BlockTokens {
		return r, fmt.Errorf("input_length %d tokens is too short for %d blocks of hash_ids (%d tokens each, only the last partial)",
			in, len(ids), BlockTokens)
	}
	for i, id := range ids {
		if id < 0 {
			return r, fmt.Errorf("hash_ids[%d] = %d is negative", i, id)
		}
	}
	if len(ids) > 1 {
		seen := make(map[int64]struct{}, len(ids))
		for i, id := range ids {
			if _, dup := seen[id]; dup {
				return r, fmt.Errorf("hash_ids[%d] = %d repeats an earlier id of the same chain", i, id)
			}
			seen[id] = struct{}{}
		}
	}
	r.Timestamp, r.InputLength, r.OutputLength, r.HashIDs = ts, in, raw.OutputLength, ids
	return r, nil
}

// Reader streams requests from a trace.
type Reader struct {
	br   *bufio.Reader
	line int
	buf  []byte
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader { return &Reader{br: bufio.NewReaderSize(r, 1<<16)} }

// Line is the number of the line last read (1-based).
func (r *Reader) Line() int { return r.line }

// Next returns the next request, io.EOF at the end of input, or a *LineError.
// Blank lines are skipped.
func (r *Reader) Next() (Request, error) {
	for {
		r.buf = r.buf[:0]
		var err error
		for {
			var chunk []byte
			chunk, err = r.br.ReadSlice('\n')
			r.buf = append(r.buf, chunk...)
			if len(r.buf) > MaxLineBytes {
				r.line++
				return Request{}, &LineError{r.line, fmt.Errorf("line longer than %d bytes", MaxLineBytes)}
			}
			if err != bufio.ErrBufferFull {
				break
			}
		}
		if len(r.buf) == 0 && err == io.EOF {
			return Request{}, io.EOF
		}
		if err != nil && err != io.EOF {
			return Request{}, fmt.Errorf("trace: read after line %d: %w", r.line, err)
		}
		r.line++
		req, derr := DecodeLine(r.buf)
		if derr == ErrEmptyLine {
			if err == io.EOF {
				return Request{}, io.EOF
			}
			continue
		}
		if derr != nil {
			return Request{}, &LineError{r.line, derr}
		}
		req.Line = r.line
		return req, nil
	}
}

// ReadAll reads every request of r.
func ReadAll(r io.Reader) ([]Request, error) {
	tr := NewReader(r)
	var out []Request
	for {
		req, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, req)
	}
}

// ReadFile reads a whole trace file.
func ReadFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := ReadAll(f)
	if err != nil {
		return reqs, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// Write writes reqs in the trace format, one JSON object per line.
func Write(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range reqs {
		r := reqs[i]
		if r.HashIDs == nil {
			r.HashIDs = []int64{}
		}
		if err := enc.Encode(&r); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Split returns the first and second half of a trace by request count. The
// halves share the underlying array; callers must not append to first.
func Split(reqs []Request) (first, second []Request) {
	h := len(reqs) / 2
	return reqs[:h:h], reqs[h:]
}

// Stats summarizes a trace.
type Stats struct {
	Requests       int
	BlockRefs      int     // sum of len(hash_ids)
	DistinctBlocks int     // distinct ids
	OnceBlocks     int     // ids referenced by exactly one request
	InfiniteHit    float64 // prefix hit ratio of an unlimited cache
	DurationMs     int64   // last timestamp - first timestamp
}

// Summarize computes Stats. InfiniteHit counts, per request, the leading
// blocks that some earlier request referenced.
func Summarize(reqs []Request) Stats {
	var s Stats
	s.Requests = len(reqs)
	seen := make(map[int64]int32)
	hits := 0
	for _, r := range reqs {
		s.BlockRefs += len(r.HashIDs)
		lead := true
		for _, id := range r.HashIDs {
			c, ok := seen[id]
			if !ok {
				lead = false
			} else if lead {
				hits++
			}
			seen[id] = c + 1
		}
	}
	s.DistinctBlocks = len(seen)
	for _, c := range seen {
		if c == 1 {
			s.OnceBlocks++
		}
	}
	if s.BlockRefs > 0 {
		s.InfiniteHit = float64(hits) / float64(s.BlockRefs)
	}
	if len(reqs) > 0 {
		s.DurationMs = reqs[len(reqs)-1].Timestamp - reqs[0].Timestamp
	}
	return s
}
