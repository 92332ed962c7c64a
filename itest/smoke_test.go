package itest

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/daemon"
)

func TestSmokeInProcess(t *testing.T) {
	dir := t.TempDir()
	cfg, err := daemon.LoadFromArgs([]string{"-runtime-dir", dir, "-state-dir", filepath.Join(dir, "state"), "-host-capacity", "128MiB"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host.SlabBytes = 16 << 20
	d, err := daemon.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()

	c, err := client.Dial(ctx, client.Options{Socket: cfg.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns := client.Namespace{ModelID: "m", Layers: 1, KVHeads: 1, HeadDim: 64, DType: "fp16", TokensPerBlock: 16, TPSize: 1, BlockBytes: 1 << 20}
	s, err := c.Open(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	hs := client.ChainHashes(client.Hash{}, make([]uint32, 16*4), 16)
	blk := bytes.Repeat([]byte{7}, 1<<20)
	if ok, err := s.Put(ctx, hs[0], blk); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := s.Put(ctx, hs[0], blk); err != nil || ok {
		t.Fatal("dup", ok, err)
	}
	r, err := s.Lookup(ctx, hs)
	if err != nil || r.Hits != 1 {
		t.Fatal(r, err)
	}
	dst := make([]byte, 1<<20)
	if err := s.Get(ctx, hs[0], dst); err != nil || !bytes.Equal(dst, blk) {
		t.Fatal(err)
	}
	t0 := time.Now()
	for i := 0; i < 1000; i++ {
		s.Lookup(ctx, hs[:1])
	}
	t.Logf("lookup rtt avg %v", time.Since(t0)/1000)
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", st.Tiers)
}
