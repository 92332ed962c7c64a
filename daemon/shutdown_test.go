package daemon

import (
	"net"
	"testing"
	"time"

	"github.com/kvtier/kvtier/shm"
)

// dialAdmin opens a raw admin connection and reads its Welcome.
func dialAdmin(t *testing.T, cfg Config) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: cfg.Socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	h := shm.Hello{Flags: shm.HelloFlagAdmin, Name: "audit"}
	if err := shm.SendMsg(c, shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, h.Encode())); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	raw, _, err := shm.RecvMsg(c, buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ty, _, _, err := shm.DecodeMsg(raw); err != nil || ty != shm.MsgWelcome {
		t.Fatalf("welcome: type %d err %v", ty, err)
	}
	return c
}

// TestShutdownWithAdminPeerNotReading: an admin client that sends status
// requests and never reads the replies fills its socket, and the daemon's
// reply blocks; shutdown must cut that write (it used to cut only reads,
// and Run waited for the admin goroutine forever).
func TestShutdownWithAdminPeerNotReading(t *testing.T) {
	cfg := testConfig(t)
	r := startDaemon(t, cfg, nil)
	c := dialAdmin(t, cfg)
	t.Cleanup(func() { c.Close() }) // runs before r.stop: lets a stuck Run finish
	req := shm.EncodeMsg(shm.MsgStatsReq, shm.ProtocolVersion, nil)
	c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	sent := 0
	for ; sent < 1<<20; sent++ {
		if err := shm.SendMsg(c, req); err != nil {
			break // our send queue is full too: the daemon is stuck writing
		}
	}
	t.Logf("sent %d status requests without reading a reply", sent)
	r.cancel()
	select {
	case err := <-r.done:
		r.done = nil
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of cancel: shutdown blocked on an admin peer that does not read")
	}
}

// TestReloadDuringShutdown: reloads racing Run's shutdown (a SIGHUP just
// before a SIGTERM) finish before the tiers close, or are refused; they
// used to read the NVMe store while closeResources closed and cleared it.
func TestReloadDuringShutdown(t *testing.T) {
	cfg := testConfig(t)
	cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 128*MiB, false
	r := startDaemon(t, cfg, nil)
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			default:
			}
			next := r.d.Config()
			next.NVMe.Capacity = ByteSize(96+32*(i%2)) * MiB
			_ = r.d.Reload(next)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	r.stop(t)
	close(quit)
	<-done
	if err := r.d.Reload(r.d.Config()); err == nil {
		t.Fatal("a reload after shutdown was applied")
	}
}

// TestReloadRefusedChangesNothing: a reload refused for one field leaves
// every other field as it was, the NVMe budget included (a host capacity
// past int64 passed Validate, and the reload failed after it had already
// applied the new NVMe budget).
func TestReloadRefusedChangesNothing(t *testing.T) {
	cfg := testConfig(t)
	cfg.NVMe.Enabled, cfg.NVMe.Capacity = true, 128*MiB
	r := startDaemon(t, cfg, nil)
	if r.d.nvme == nil {
		t.Fatal("nvme tier did not open")
	}
	next := r.d.Config()
	next.NVMe.Capacity = 96 * MiB
	next.Host.Capacity = 1 << 63 // "8EiB"
	err := r.d.Reload(next)
	if err == nil {
		t.Fatal("Reload accepted host.capacity 8EiB")
	}
	if got := r.d.nvme.Stats().Capacity; got != 128*MiB {
		t.Errorf("refused reload changed the NVMe budget: %v, want 128MiB (Config says %v)",
			ByteSize(got), r.d.Config().NVMe.Capacity)
	}
}
