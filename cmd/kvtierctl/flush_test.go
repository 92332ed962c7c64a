package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestFlush(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon")
	}
	sock := startDaemon(t, 128, true)
	putBlocks(t, sock, 2, 5)

	out := mustRun(t, "flush", "--json", "--socket", sock)
	var res flushResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("flush --json: %v\n%s", err, out)
	}
	if res.Blocks != 5 {
		t.Errorf("first flush wrote %d blocks, want 5", res.Blocks)
	}
	// The host tier keeps its copies, and they are in NVMe now.
	out = mustRun(t, "flush", "--socket", sock)
	if !strings.Contains(out, "flushed 0 blocks to nvme") {
		t.Errorf("second flush: %q", out)
	}
	var st struct {
		Tiers []struct {
			Name   string `json:"name"`
			Blocks int    `json:"blocks"`
		} `json:"tiers"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "status", "--json", "--socket", sock)), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Tiers) != 2 || st.Tiers[0].Blocks != 5 || st.Tiers[1].Name != "nvme" || st.Tiers[1].Blocks != 5 {
		t.Errorf("after flush: tiers %+v, want 5 blocks in host and in nvme", st.Tiers)
	}

	// More blocks: only the new ones go down.
	putBlocks(t, sock, 3, 3)
	if out := mustRun(t, "flush", "--socket", sock, "--timeout", "30s"); !strings.Contains(out, "flushed 3 blocks") {
		t.Errorf("third flush: %q", out)
	}
}

func TestFlushWithoutNVMe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon")
	}
	sock := startDaemon(t, 128, false)
	if _, err := run(t, "flush", "--socket", sock); err == nil || !strings.Contains(err.Error(), "without an NVMe tier") {
		t.Errorf("flush without nvme: %v", err)
	}
}
