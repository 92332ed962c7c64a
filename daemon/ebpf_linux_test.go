package daemon

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/ebpf"
	"github.com/kvtier/kvtier/internal/bpfcaps"
	"github.com/kvtier/kvtier/shm"
)

// requireBPF skips unless eBPF programs can load here (root, kernel BTF).
func requireBPF(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF and CAP_PERFMON) to load eBPF programs")
	}
	if err := (ebpf.Env{}).Check(); err != nil {
		t.Skipf("eBPF environment incomplete: %v", err)
	}
}

const (
	exitHelperEnv = "KVTIER_TEST_EXIT_CLIENT" // socket path
	helperReserve = 3                         // reservations the helper holds
	helperLease   = 2                         // leases the helper holds
)

// TestExitHelperClient is not a test: it is the client process of
// TestClientExit (the test binary re-run). It opens a session, holds
// reservations and leases, starts a child that inherits the session's
// socket and sleeps, says "ready <child pid>" and waits to be killed.
func TestExitHelperClient(t *testing.T) {
	sock := os.Getenv(exitHelperEnv)
	if sock == "" {
		t.Skip("helper process of TestClientExit")
	}
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Options{Socket: sock, Name: "exit-helper"})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	s, err := c.Open(ctx, testNamespace(64<<10))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	for i := range helperLease {
		b := make([]byte, s.BlockBytes())
		if _, err := s.Put(ctx, testHash(100+i), b); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		if _, err := s.Acquire(ctx, testHash(100+i)); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
	}
	for i := range helperReserve {
		if _, err := s.Reserve(ctx, testHash(i)); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
	}
	// The child inherits every socket (cleared of close-on-exec): the
	// daemon's side sees no EOF while it lives.
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); fd > 2 && strings.HasPrefix(l, "socket:") {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0)
		}
	}
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	fmt.Println("ready", child.Process.Pid)
	select {}
}

// runExitScenario starts the helper against d, kills it with SIGKILL and
// returns how long the daemon took to free its slots, and the child.
// bound is how long to wait for the slots; 0 means "they must stay".
func runExitScenario(t *testing.T, d *Daemon, bound time.Duration) (time.Duration, *os.Process, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestExitHelperClient$", "-test.v=false")
	cmd.Env = append(os.Environ(), exitHelperEnv+"="+d.cfg.Socket)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 2 || f[0] != "ready" {
		t.Fatalf("helper: %q %v", line, err)
	}
	childPid, _ := strconv.Atoi(f[1])
	child, _ := os.FindProcess(childPid)
	t.Cleanup(func() { child.Kill(); child.Wait() })
	hs := d.host.Stats()
	if hs.Reserved != helperReserve || hs.Leased != helperLease {
		t.Fatalf("before the kill: reserved %d leased %d, want %d and %d", hs.Reserved, hs.Leased, helperReserve, helperLease)
	}
	t0 := time.Now()
	cmd.Process.Signal(syscall.SIGKILL)
	deadline := t0.Add(bound)
	if bound == 0 {
		deadline = t0.Add(500 * time.Millisecond)
	}
	for time.Now().Before(deadline) {
		if hs := d.host.Stats(); hs.Reserved == 0 && hs.Leased == 0 {
			return time.Since(t0), child, true
		}
		time.Sleep(100 * time.Microsecond)
	}
	return time.Since(t0), child, false
}

// waitFreed polls until the host tier holds no reservation or lease.
func waitFreed(d *Daemon, bound time.Duration) bool {
	for t0 := time.Now(); time.Since(t0) < bound; time.Sleep(100 * time.Microsecond) {
		if hs := d.host.Stats(); hs.Reserved == 0 && hs.Leased == 0 {
			return true
		}
	}
	return false
}

// TestClientExit measures kill -9 → slots freed for a client whose forked
// child still holds the session socket: with the eBPF exit tracer the
// slots free within milliseconds; without it (ebpf.enabled=false) they stay
// until the child exits and the socket reads EOF.
func TestClientExit(t *testing.T) {
	requireBPF(t)
	t.Run("ebpf", func(t *testing.T) {
		cfg := testConfig(t)
		r := startDaemon(t, cfg, nil)
		if !r.d.probes.enabled()[ebpf.ProgExit] {
			t.Skip("exit tracer did not load (see the log)")
		}
		dt, child, ok := runExitScenario(t, r.d, 5*time.Second)
		if !ok {
			t.Fatalf("slots not freed %v after the kill, child still holding the socket", dt)
		}
		t.Logf("eBPF path: kill -9 → reservations and leases freed in %v (child %d still holds the socket)", dt, child.Pid)
		if dt > time.Second {
			t.Errorf("eBPF path took %v, want well under 1s", dt)
		}
		if got := r.d.probes.exits.Load(); got != 1 {
			t.Errorf("client_exit_sessions_total %d, want 1", got)
		}
		// The session leaves the filter as it finishes closing, just after
		// its slots were freed: allow it a moment.
		deadline := time.Now().Add(2 * time.Second)
		for r.d.probes.exit.Watched() != 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if n := r.d.probes.exit.Watched(); n != 0 {
			t.Errorf("exit filter still holds %d pids after the session closed", n)
		}
	})
	t.Run("fallback", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.EBPF.Enabled = false
		r := startDaemon(t, cfg, nil)
		dt, child, ok := runExitScenario(t, r.d, 0)
		if ok {
			t.Fatalf("slots freed %v after the kill without eBPF, while a child holds the socket", dt)
		}
		t1 := time.Now()
		child.Kill()
		if !waitFreed(r.d, 5*time.Second) {
			t.Fatal("slots not freed after the child exited (socket EOF)")
		}
		t.Logf("EOF path: slots held %v after kill -9 of the client (until its child was killed), then freed %v after the child's death",
			time.Since(t1)+dt, time.Since(t1))
	})
}

// TestEBPFUnavailable: with BTF missing the daemon starts, logs one line
// per program, exports kvtier_ebpf_enabled 0 and still frees a dead
// client's slots at EOF.
func TestEBPFUnavailable(t *testing.T) {
	for name, env := range map[string]ebpf.Env{
		"no BTF": {BTF: filepath.Join(t.TempDir(), "vmlinux")},
	} {
		t.Run(name, func(t *testing.T) {
			ebpfEnv = env
			defer func() { ebpfEnv = ebpf.Env{} }()
			cfg := testConfig(t)
			cfg.Metrics.Listen = "127.0.0.1:0"
			cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 256*MiB, false
			var buf syncBuffer
			md := startDaemon(t, cfg, slog.New(slog.NewTextHandler(&buf, nil)))
			logs := buf.String()
			for _, prog := range ebpf.Programs {
				if n := strings.Count(logs, "program="+prog+" fallback="); n != 1 {
					t.Errorf("%d fallback lines for %s, want 1:\n%s", n, prog, logs)
				}
			}
			f := scrape(t, md.d.MetricsAddr())
			for _, prog := range ebpf.Programs {
				if v := f.must(t, "kvtier_ebpf_enabled", "program", prog); v != 0 {
					t.Errorf("kvtier_ebpf_enabled{program=%q} = %v, want 0", prog, v)
				}
			}
			if _, ok := f.value("kvtier_nvme_io_latency_seconds", "op", "read"); ok {
				t.Error("nvme io histogram exported with the probe off")
			}
			st := md.d.Stats()
			if st.MemoryPressure == nil || st.MemoryPressure.Source != "psi" {
				t.Errorf("memory pressure %+v, want the PSI fallback", st.MemoryPressure)
			}
		})
	}
}

const (
	stateHelperEnv = "KVTIER_TEST_EBPF_STATE" // the helper's mode:
	stateNoCaps    = "nocaps"                 // no capability at all
	stateBPFCaps   = "bpfcaps"                // uid 65534 with CAP_BPF+CAP_PERFMON only
)

// TestEBPFStateHelper is not a test: it is the child of
// TestEBPFWithoutCaps (run in a new user namespace: no capability in the
// initial one, so no CAP_BPF/CAP_PERFMON) and of TestEBPFUnprivileged (uid
// 65534 with only CAP_BPF and CAP_PERFMON, as under the systemd unit). It
// starts a daemon and prints its eBPF state and log; in the second case,
// with the NVMe tier on, and the outcome of a client's kill -9 while its
// child holds the socket.
func TestEBPFStateHelper(t *testing.T) {
	mode := os.Getenv(stateHelperEnv)
	if mode == "" {
		t.Skip("helper process of TestEBPFWithoutCaps and TestEBPFUnprivileged")
	}
	cfg := testConfig(t)
	if mode == stateBPFCaps {
		bpfcaps.Verify(t)
		cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 256*MiB, false
	}
	var buf syncBuffer
	r := startDaemon(t, cfg, slog.New(slog.NewTextHandler(&buf, nil)))
	st := r.d.Stats()
	if mode == stateBPFCaps && st.EBPF[ebpf.ProgExit] {
		dt, _, ok := runExitScenario(t, r.d, 5*time.Second)
		fmt.Printf("EXIT freed=%v after %v\n", ok, dt)
	}
	r.stop(t)
	fmt.Printf("ENABLED %v\n", st.EBPF)
	fmt.Print(buf.String())
}

// TestEBPFWithoutCaps runs a daemon without CAP_BPF/CAP_PERFMON (a child
// of the test binary in a new user namespace): it starts, logs one line
// per program with the missing capability, and reports every program off.
func TestEBPFWithoutCaps(t *testing.T) {
	requireBPF(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestEBPFStateHelper$", "-test.v=false")
	cmd.Env = append(os.Environ(), stateHelperEnv+"="+stateNoCaps)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "operation not permitted") && len(out) < 200 {
			t.Skipf("cannot create a user namespace here: %s", out)
		}
		t.Fatalf("daemon without caps: %v\n%s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "ENABLED map[exit:false nvme_io:false vmscan:false]") {
		t.Fatalf("eBPF state without caps:\n%s", s)
	}
	for _, prog := range []string{ebpf.ProgExit, ebpf.ProgVmscan} {
		if n := strings.Count(s, "program="+prog+" fallback="); n != 1 {
			t.Errorf("%d fallback lines for %s, want 1:\n%s", n, prog, s)
		}
	}
	if !strings.Contains(s, "CAP_BPF") {
		t.Errorf("no line names the missing capability:\n%s", s)
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "fallback=") {
			t.Log(l)
		}
	}
}

// TestEBPFUnprivileged runs a daemon as the systemd unit does: uid 65534
// with only CAP_BPF and CAP_PERFMON (a child of the test binary), where
// tracefs cannot be read. Every probe loads (nvme_io only where the state
// dir is on a disk), and a killed client's slots are freed by the exit
// probe while its child still holds the socket.
func TestEBPFUnprivileged(t *testing.T) {
	requireBPF(t)
	cmd := bpfcaps.Command(t, "-test.run=^TestEBPFStateHelper$", "-test.v=false", "-test.count=1")
	cmd.Env = append(cmd.Env, stateHelperEnv+"="+stateBPFCaps)
	out, err := bpfcaps.CombinedOutput(t, cmd)
	s := string(out)
	if err != nil {
		t.Fatalf("daemon as uid %d with CAP_BPF+CAP_PERFMON: %v\n%s", bpfcaps.UID, err, s)
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "ENABLED") || strings.HasPrefix(l, "EXIT") || strings.Contains(l, "ebpf") {
			t.Log(l)
		}
	}
	want := "ENABLED map[exit:true nvme_io:true vmscan:true]"
	if !strings.Contains(s, want) {
		// A state dir on tmpfs has no disk to watch: nvme_io may only be
		// off for that reason.
		noDisk := strings.Contains(s, "ENABLED map[exit:true nvme_io:false vmscan:true]") &&
			strings.Contains(s, "not a block device")
		if !noDisk {
			t.Fatalf("eBPF state as uid %d with CAP_BPF+CAP_PERFMON, want %q:\n%s", bpfcaps.UID, want, s)
		}
		t.Log("nvme_io off: the state dir is not on a block device")
	} else if !strings.Contains(s, "program="+ebpf.ProgNVMeIO+" disks=") {
		t.Errorf("the daemon did not log the disks nvme_io watches:\n%s", s)
	}
	if !strings.Contains(s, "EXIT freed=true") {
		t.Errorf("a killed client's slots were not freed by the exit probe:\n%s", s)
	}
	for _, prog := range []string{ebpf.ProgExit, ebpf.ProgVmscan} {
		if strings.Contains(s, "program="+prog+" fallback=") {
			t.Errorf("%s fell back:\n%s", prog, s)
		}
	}
}

// TestEBPFMetrics: with the probes loaded, kvtier_ebpf_enabled is 1 and
// the NVMe tier's disk latency histogram counts the tier's writes.
func TestEBPFMetrics(t *testing.T) {
	requireBPF(t)
	cfg := testConfig(t)
	cfg.Metrics.Listen = "127.0.0.1:0"
	cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 256*MiB, false
	r := startDaemon(t, cfg, nil)
	if r.d.nvme == nil {
		t.Skip("nvme tier did not open")
	}
	// Writes under the state dir reach the disk the probe watches.
	p := filepath.Join(cfg.StateDir, "nvme", "probe-io")
	if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	fd, _ := os.Open(p)
	fd.Sync()
	fd.Close()
	f := scrape(t, r.d.MetricsAddr())
	for _, prog := range ebpf.Programs {
		if v := f.must(t, "kvtier_ebpf_enabled", "program", prog); v != 1 {
			t.Errorf("kvtier_ebpf_enabled{program=%q} = %v, want 1", prog, v)
		}
	}
	mf := f["kvtier_nvme_io_latency_seconds"]
	if mf == nil {
		t.Fatal("kvtier_nvme_io_latency_seconds missing")
	}
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		t.Logf("%s: %d requests, %d buckets, sum %.6fs", m.GetLabel()[0].GetValue(), h.GetSampleCount(), len(h.GetBucket()), h.GetSampleSum())
		if m.GetLabel()[0].GetValue() == "write" && h.GetSampleCount() == 0 {
			t.Error("no write counted on the state dir's disk")
		}
	}
	if _, ok := f.value("kvtier_host_target_ratio"); !ok {
		t.Error("kvtier_host_target_ratio missing")
	}
	st := r.d.Stats()
	if st.MemoryPressure == nil || st.MemoryPressure.Source != "vmscan" || st.MemoryPressure.TargetRatio != 1 {
		t.Errorf("memory pressure %+v, want source vmscan at ratio 1", st.MemoryPressure)
	}
}

// fakePressure is a PressureSource the test sets.
type fakePressure struct{ v atomic.Value }

func (f *fakePressure) Name() string { return "fake" }
func (f *fakePressure) Pressure(time.Duration) (float64, error) {
	v, _ := f.v.Load().(float64)
	return v, nil
}

// TestPressureDemotes drives the daemon's controller with a faked signal
// (not eBPF-specific: runs anywhere): under pressure the host tier's
// target shrinks and the mover demotes the coldest blocks to NVMe; when
// the pressure is gone the configured watermarks come back. Status and
// metrics show the state.
func TestPressureDemotes(t *testing.T) {
	cfg := testConfig(t)
	cfg.Metrics.Listen = "127.0.0.1:0"
	cfg.NVMe.Enabled, cfg.NVMe.Capacity, cfg.NVMe.FlushOnStop = true, 256*MiB, false
	d, err := New(cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if d.nvme == nil {
		d.closeResources()
		t.Skip("nvme tier did not open")
	}
	src := &fakePressure{}
	src.v.Store(0.0)
	d.probes.ctl = ebpf.NewController(ebpf.ControllerConfig{Interval: 20 * time.Millisecond, Calm: 2, Step: 0.25, Min: 0.25},
		src, d.chain, "", d.log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	c, err := client.Dial(ctx, client.Options{Socket: cfg.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, testNamespace(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	putBlocks(t, s, 96) // 6 of 8 MiB
	before := d.host.Stats().UsedBytes
	src.v.Store(50.0)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for t0 := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Since(t0) > 10*time.Second {
				t.Fatalf("%s: not within 10s (state %+v, host %+v)", what, d.probes.ctl.State(), d.host.Stats())
			}
		}
	}
	waitFor("target at its floor", func() bool { return d.probes.ctl.State().TargetRatio == 0.25 })
	limit := int64(0.25 * 0.95 * float64(cfg.Host.Capacity))
	waitFor("host tier under the shrunk watermark", func() bool { return d.host.Stats().UsedBytes <= limit })
	st := d.Stats()
	if st.MemoryPressure == nil || st.MemoryPressure.TargetRatio != 0.25 || st.MemoryPressure.Source != "fake" {
		t.Errorf("status memory_pressure %+v", st.MemoryPressure)
	}
	f := scrape(t, d.MetricsAddr())
	if v := f.must(t, "kvtier_host_target_ratio"); v != 0.25 {
		t.Errorf("kvtier_host_target_ratio %v", v)
	}
	if v := f.must(t, "kvtier_memory_pressure", "source", "fake"); v != 50 {
		t.Errorf("kvtier_memory_pressure %v", v)
	}
	t.Logf("under pressure: host tier %d → %d bytes, %d blocks demoted", before, d.host.Stats().UsedBytes, d.chain.Stats().Demoted)
	if d.chain.Stats().Demoted == 0 {
		t.Error("nothing demoted to NVMe")
	}
	src.v.Store(0.0)
	waitFor("target back to full", func() bool { return d.probes.ctl.State().TargetRatio == 1 })
	if h, l := d.chain.Watermarks(); h != cfg.Host.HighWatermark || l != cfg.Host.LowWatermark {
		t.Errorf("watermarks %v/%v after the pressure, want the configured %v/%v", h, l, cfg.Host.HighWatermark, cfg.Host.LowWatermark)
	}
	// The demoted blocks are still served (promoted back from NVMe).
	buf := make([]byte, s.BlockBytes())
	if err := s.Get(ctx, testHash(0), buf); err != nil {
		t.Errorf("get of a demoted block: %v", err)
	}
	s.Close()
}

const passConnEnv = "KVTIER_TEST_PASS_CONN" // socket path

// TestPassConnHelper is not a test: the connecting process of
// TestEarlyDeathWatched. It connects to the daemon (so SO_PEERCRED
// names it), hands the connected socket to its parent over fd 3 (as a
// forked child inherits it) and exits.
func TestPassConnHelper(t *testing.T) {
	sock := os.Getenv(passConnEnv)
	if sock == "" {
		t.Skip("helper process of TestEarlyDeathWatched")
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		os.Exit(2)
	}
	f, _ := c.File()
	if err := unix.Sendmsg(3, []byte{1}, unix.UnixRights(int(f.Fd())), nil, 0); err != nil {
		os.Exit(3)
	}
	os.Exit(0)
}

// TestEarlyDeathWatched: the process that connected (the pid the exit
// tracer watches) dies before its session is watched, while another process
// holds the socket (a forked child) and completes the handshake. The session
// belongs to a dead pid: with the exit tracer loaded it must be stopped
// promptly, as when the death comes a moment later (TestClientExit).
func TestEarlyDeathWatched(t *testing.T) {
	requireBPF(t)
	cfg := testConfig(t)
	r := startDaemon(t, cfg, nil)
	if !r.d.probes.enabled()[ebpf.ProgExit] {
		t.Skip("exit tracer did not load")
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[0])
	child := os.NewFile(uintptr(sp[1]), "sp")
	cmd := exec.Command(os.Args[0], "-test.run=^TestPassConnHelper$")
	cmd.Env = append(os.Environ(), passConnEnv+"="+cfg.Socket)
	cmd.ExtraFiles = []*os.File{child}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child.Close()
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(sp[0], make([]byte, 1), oob, 0)
	if err != nil {
		t.Fatal(err)
	}
	scm, _ := unix.ParseSocketControlMessage(oob[:oobn])
	fds, err := unix.ParseUnixRights(&scm[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	deadPid := cmd.Process.Pid
	fc, err := net.FileConn(os.NewFile(uintptr(fds[0]), "conn"))
	if err != nil {
		t.Fatal(err)
	}
	conn := fc.(*net.UnixConn)
	defer conn.Close()
	h := shm.Hello{PID: uint32(deadPid), Name: "orphan", Namespace: shm.Namespace{ModelID: "lifecycle", Layers: 1,
		KVHeads: 1, HeadDim: 64, DType: "bf16", TokensPerBlock: 16, TPSize: 1, BlockBytes: 4096}}
	if err := shm.SendMsg(conn, shm.EncodeMsg(shm.MsgHello, shm.ProtocolVersion, h.Encode())); err != nil {
		t.Fatal(err)
	}
	raw, wfds, err := shm.RecvMsg(conn, make([]byte, 4096), shm.WelcomeFDs)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range wfds {
		unix.Close(fd)
	}
	if typ, _, _, _ := shm.DecodeMsg(raw); typ != shm.MsgWelcome {
		t.Fatalf("got message type %d, want a welcome", typ)
	}
	// The welcome goes out just before the session is registered and
	// watched: wait for that first.
	for t0 := time.Now(); r.d.sessionCount() == 0 && r.d.sessionsTotal.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Since(t0) > 5*time.Second {
			t.Fatal("session never registered")
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for r.d.sessionCount() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := r.d.sessionCount(); n != 0 {
		t.Fatalf("session of dead pid %d still open 2s after its welcome (exit filter holds %d pids): its death was missed",
			deadPid, r.d.probes.exit.Watched())
	}
}
