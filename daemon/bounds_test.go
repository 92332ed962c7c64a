package daemon

// Peers that make the daemon's state grow: namespaces, admin connections.

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
)

// TestStatusWithManyNamespaces: every namespace a hello names is registered
// for good (up to maxNamespaces), and the status reply listed them all in one
// SOCK_SEQPACKET message, which the socket's send buffer caps (about 208 KiB
// by default): a few hundred namespaces with long model ids and no operator
// could read the status any more (kvtierctl status, top).
func TestStatusWithManyNamespaces(t *testing.T) {
	cfg := testConfig(t)
	r := startDaemon(t, cfg, slog.New(slog.DiscardHandler))
	// What a hello naming a new namespace does (rawOpen's handshakes would
	// take seconds more and register the same).
	const n = 600
	for i := range n {
		if _, err := r.d.reg.Register(rawNS(fmt.Sprintf("%s-%d", strings.Repeat("m", 240), i), 4096)); err != nil {
			t.Fatal(err)
		}
	}
	// A namespace in use is listed whatever else is registered.
	p, code := rawOpen(t, cfg.Socket, rawNS("in-use", 4096))
	if p == nil {
		t.Fatalf("session refused: %d", code)
	}
	c := dialDaemon(t, cfg)
	var st *client.Stats
	// The session joins the daemon's table just after its Welcome.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if st, err = c.Stats(context.Background()); err != nil {
			t.Fatalf("status with %d namespaces registered: %v", n+1, err)
		}
		if st.Sessions == 1 || time.Now().After(deadline) {
			break
		}
	}
	if st.NamespacesTotal != n+1 || len(st.Namespaces) >= n+1 {
		t.Errorf("namespaces_total = %d, listed %d; want %d, fewer listed", st.NamespacesTotal, len(st.Namespaces), n+1)
	}
	if len(st.Namespaces) == 0 || st.Namespaces[0].Namespace.ModelID != "in-use" || st.Namespaces[0].Sessions != 1 {
		t.Errorf("the namespace with a session is not listed first: %+v", st.Namespaces[:min(1, len(st.Namespaces))])
	}
	for i := 2; i < len(st.Namespaces); i++ {
		if st.Namespaces[i].ID <= st.Namespaces[i-1].ID {
			t.Fatalf("namespaces without sessions not in id order: %d after %d", st.Namespaces[i].ID, st.Namespaces[i-1].ID)
		}
	}
}
