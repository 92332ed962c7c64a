package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
)

func tokens(n int, salt uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i)*2654435761 ^ salt
	}
	return t
}

func TestChainHashesDeterministic(t *testing.T) {
	toks := tokens(64, 1)
	a := client.ChainHashes(client.Hash{}, toks, 16)
	b := client.ChainHashes(client.Hash{}, append([]uint32{}, toks...), 16)
	if len(a) != 4 {
		t.Fatalf("%d hashes for 4 full blocks", len(a))
	}
	seen := map[client.Hash]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("hash %d differs between identical calls", i)
		}
		if a[i] == (client.Hash{}) || seen[a[i]] {
			t.Fatalf("hash %d is zero or repeated: %v", i, a[i])
		}
		seen[a[i]] = true
	}
}

func TestChainHashesChaining(t *testing.T) {
	const tpb = 16
	toks := tokens(8*tpb, 2)
	full := client.ChainHashes(client.Hash{}, toks, tpb)
	// h_i = HashBlock(h_{i-1}, block i), from the given parent.
	parent := client.Hash{}
	for i, h := range full {
		parent = client.HashBlock(parent, toks[i*tpb:(i+1)*tpb])
		if h != parent {
			t.Fatalf("hash %d is not HashBlock of its parent and block", i)
		}
	}
	// A prefix of the tokens gives a prefix of the hashes.
	for k := 0; k <= 8; k++ {
		pre := client.ChainHashes(client.Hash{}, toks[:k*tpb], tpb)
		if len(pre) != k {
			t.Fatalf("prefix of %d blocks: %d hashes", k, len(pre))
		}
		for i := range pre {
			if pre[i] != full[i] {
				t.Fatalf("prefix of %d blocks: hash %d differs", k, i)
			}
		}
	}
	// A trailing partial block has no hash.
	for extra := 1; extra < tpb; extra++ {
		got := client.ChainHashes(client.Hash{}, toks[:3*tpb+extra], tpb)
		if len(got) != 3 || got[2] != full[2] {
			t.Fatalf("partial block of %d tokens: %d hashes", extra, len(got))
		}
	}
	// Changing block 3 changes hashes 3.. and nothing before.
	mod := append([]uint32{}, toks...)
	mod[3*tpb+5]++
	changed := client.ChainHashes(client.Hash{}, mod, tpb)
	for i := range full {
		if (changed[i] == full[i]) != (i < 3) {
			t.Fatalf("after changing block 3, hash %d equal=%v", i, changed[i] == full[i])
		}
	}
	// Continuing from the last hash equals hashing everything at once.
	tail := client.ChainHashes(full[3], toks[4*tpb:], tpb)
	for i := range tail {
		if tail[i] != full[4+i] {
			t.Fatalf("continued chain: hash %d differs", i)
		}
	}
}

func TestChainHashesParent(t *testing.T) {
	toks := tokens(4*16, 3)
	a := client.ChainHashes(client.Hash{}, toks, 16)
	b := client.ChainHashes(client.Hash{Lo: 1}, toks, 16)
	c := client.ChainHashes(client.Hash{Hi: 1}, toks, 16)
	for i := range a {
		if a[i] == b[i] || a[i] == c[i] || b[i] == c[i] {
			t.Fatalf("hash %d equal under different parents", i)
		}
	}
}

func TestChainHashesEdges(t *testing.T) {
	if h := client.ChainHashes(client.Hash{}, tokens(32, 0), 0); h != nil {
		t.Fatalf("tokensPerBlock 0: %v", h)
	}
	if h := client.ChainHashes(client.Hash{}, tokens(32, 0), -1); h != nil {
		t.Fatalf("tokensPerBlock -1: %v", h)
	}
	if h := client.ChainHashes(client.Hash{}, nil, 16); len(h) != 0 {
		t.Fatalf("no tokens: %v", h)
	}
	if h := client.ChainHashes(client.Hash{}, tokens(15, 0), 16); len(h) != 0 {
		t.Fatalf("less than a block: %v", h)
	}
	// Blocks of one token: the token boundaries matter.
	a := client.ChainHashes(client.Hash{}, []uint32{1, 2}, 1)
	b := client.ChainHashes(client.Hash{}, []uint32{1, 2}, 2)
	if len(a) != 2 || len(b) != 1 || a[1] == b[0] {
		t.Fatalf("block size must be part of the chain: %v %v", a, b)
	}
}

func TestDialMissingSocket(t *testing.T) {
	dir := t.TempDir()
	for _, sock := range []string{filepath.Join(dir, "none.sock"), dir} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := client.Dial(ctx, client.Options{Socket: sock})
		cancel()
		if !errors.Is(err, client.ErrDisconnected) {
			t.Fatalf("dial %s: %v, want ErrDisconnected", sock, err)
		}
	}
}

// startDaemon runs an in-process daemon for the duration of the test.
func startDaemon(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "kvc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg, err := daemon.LoadFromArgs([]string{"-runtime-dir", dir, "-state-dir", filepath.Join(dir, "state"), "-host-capacity", "128MiB", "-metrics-listen", ""})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host.Capacity, cfg.Host.SlabBytes = 16<<20, 4<<20
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return cfg.Socket
}

// openSession starts a daemon and opens a session of testNS on it; both
// close with the test.
func openSession(t *testing.T) (*client.Client, *client.Session) {
	t.Helper()
	sock := startDaemon(t)
	c, err := client.Dial(context.Background(), client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.Open(context.Background(), testNS())
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

func testNS() client.Namespace {
	return client.Namespace{ModelID: "m", Layers: 1, KVHeads: 1, HeadDim: 64, DType: "bf16", TokensPerBlock: 16, TPSize: 1, BlockBytes: 8192}
}

func TestFinishTwice(t *testing.T) {
	ctx := context.Background()
	c, s := openSession(t)
	hs := client.ChainHashes(client.Hash{}, tokens(5*16, 4), 16)

	r, err := s.Reserve(ctx, hs[0])
	if err != nil || r == nil {
		t.Fatal(r, err)
	}
	if len(r.Bytes()) != 8192 {
		t.Fatalf("slot of %d bytes", len(r.Bytes()))
	}
	copy(r.Bytes(), bytes.Repeat([]byte{9}, 8192))
	if err := r.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(ctx); !errors.Is(err, client.ErrDone) {
		t.Fatalf("second commit: %v", err)
	}
	if err := r.Abort(ctx); !errors.Is(err, client.ErrDone) {
		t.Fatalf("abort after commit: %v", err)
	}
	if err := s.CommitBatch(ctx, []*client.Reservation{r}); !errors.Is(err, client.ErrDone) {
		t.Fatalf("batch commit of a committed reservation: %v", err)
	}
	// Already cached: Reserve answers (nil, nil).
	if dup, err := s.Reserve(ctx, hs[0]); dup != nil || err != nil {
		t.Fatalf("reserve of a cached block: %v %v", dup, err)
	}

	r2, err := s.Reserve(ctx, hs[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.Abort(ctx); !errors.Is(err, client.ErrDone) {
		t.Fatalf("second abort: %v", err)
	}
	if err := r2.Commit(ctx); !errors.Is(err, client.ErrDone) {
		t.Fatalf("commit after abort: %v", err)
	}
	if _, err := s.Acquire(ctx, hs[1]); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("aborted block: %v", err)
	}

	l, err := s.Acquire(ctx, hs[0])
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(l.Bytes(), bytes.Repeat([]byte{9}, 8192)) || l.Tier != client.TierHost {
		t.Fatal("lease bytes or tier wrong")
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); !errors.Is(err, client.ErrDone) {
		t.Fatalf("second release: %v", err)
	}
	if err := s.ReleaseBatch([]*client.Lease{l, nil}); !errors.Is(err, client.ErrDone) {
		t.Fatalf("batch release of a released lease: %v", err)
	}
	// Release does not wait for the daemon, and Stats does not travel on
	// the session's rings: a round trip on the session orders them.
	if err := s.Nop(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Tiers[0].Reserved != 0 || st.Tiers[0].Leased != 0 || st.Tiers[0].Blocks != 1 {
		t.Fatalf("tier after the double finishes: %+v", st.Tiers[0])
	}
}

func TestClosed(t *testing.T) {
	sock := startDaemon(t)
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Open(ctx, client.Namespace{ModelID: "m"}); err == nil {
		t.Fatal("invalid namespace accepted")
	}
	s, err := c.Open(ctx, testNS())
	if err != nil {
		t.Fatal(err)
	}
	if s.NamespaceID() == 0 || s.BlockBytes() != 8192 {
		t.Fatalf("namespace id %d, block %d", s.NamespaceID(), s.BlockBytes())
	}
	s2, err := c.Open(ctx, testNS())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Nop(ctx); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("call on a closed session: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := s2.Nop(ctx); err != nil {
		t.Fatal(err)
	}
	c.Close() // closes s2
	if _, err := s2.Lookup(ctx, client.ChainHashes(client.Hash{}, tokens(16, 0), 16)); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("call after Client.Close: %v", err)
	}
	if _, err := c.Open(ctx, testNS()); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("open after Client.Close: %v", err)
	}
}

// TestLazyReleaseRings checks that a release left without a doorbell (no
// later call on the session) still reaches the daemon promptly: the bell
// timer rings it. Without the timer the ring loop would only notice it when
// its bounded sleep (50 ms) runs out.
func TestLazyReleaseRings(t *testing.T) {
	ctx := context.Background()
	c, s := openSession(t)
	h := client.ChainHashes(client.Hash{}, tokens(16, 7), 16)[0]
	if ok, err := s.Put(ctx, h, bytes.Repeat([]byte{3}, 8192)); err != nil || !ok {
		t.Fatal(ok, err)
	}
	const trials = 9
	took := make([]time.Duration, 0, trials)
	for range trials {
		l, err := s.Acquire(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.Stats(ctx)
		if err != nil || st.Tiers[0].Leased != 1 {
			t.Fatalf("while leased: %+v %v", st.Tiers[0], err)
		}
		t0 := time.Now()
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
		for {
			st, err := c.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Tiers[0].Leased == 0 {
				break
			}
			if time.Since(t0) > 5*time.Second {
				t.Fatal("release never reached the daemon")
			}
		}
		took = append(took, time.Since(t0))
	}
	slices.Sort(took)
	if med := took[trials/2]; med > 20*time.Millisecond {
		t.Fatalf("median release took %v to reach the daemon (all: %v)", med, took)
	}
	t.Logf("release reached the daemon in %v (median of %d)", took[trials/2], trials)
}
