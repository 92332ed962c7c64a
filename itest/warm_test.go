package itest

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/client"
)

// fdStore plays systemd for sd_notify(3) with a file-descriptor store: a
// unixgram NOTIFY_SOCKET that keeps the fds sent with FDSTORE=1 under their
// FDNAME (one copy per file, as systemd does) and drops them on
// FDSTOREREMOVE=1.
type fdStore struct {
	t    *testing.T
	path string
	conn *net.UnixConn
	done chan struct{}

	mu    sync.Mutex
	fds   []namedFd
	synce chan struct{}
}

type namedFd struct {
	name string
	f    *os.File
}

func newFdStore(t *testing.T, dir string) *fdStore {
	path := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &fdStore{t: t, path: path, conn: conn, done: make(chan struct{})}
	go s.loop()
	t.Cleanup(func() {
		conn.Close()
		<-s.done
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, sf := range s.fds {
			sf.f.Close()
		}
	})
	return s
}

func (s *fdStore) loop() {
	defer close(s.done)
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(16*4))
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		var fds []int
		if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, cm := range cms {
				if r, err := unix.ParseUnixRights(&cm); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		s.handle(string(buf[:n]), fds)
	}
}

func (s *fdStore) handle(msg string, fds []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if msg == "SYNC" {
		close(s.synce)
		return
	}
	vars := map[string]string{}
	for _, l := range strings.Split(msg, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			vars[k] = v
		}
	}
	if vars["FDSTOREREMOVE"] == "1" {
		kept := s.fds[:0]
		for _, sf := range s.fds {
			if sf.name == vars["FDNAME"] {
				sf.f.Close()
			} else {
				kept = append(kept, sf)
			}
		}
		s.fds = kept
	}
	for _, fd := range fds {
		if vars["FDSTORE"] != "1" || s.holds(fd) {
			unix.Close(fd)
			continue
		}
		s.fds = append(s.fds, namedFd{vars["FDNAME"], os.NewFile(uintptr(fd), vars["FDNAME"])})
	}
}

func (s *fdStore) holds(fd int) bool {
	var a unix.Stat_t
	if unix.Fstat(fd, &a) != nil {
		return false
	}
	for _, sf := range s.fds {
		var b unix.Stat_t
		if unix.Fstat(int(sf.f.Fd()), &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino {
			return true
		}
	}
	return false
}

// sync waits until every message sent before it has been handled.
func (s *fdStore) sync() {
	s.t.Helper()
	ch := make(chan struct{})
	s.mu.Lock()
	s.synce = ch
	s.mu.Unlock()
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: s.path, Net: "unixgram"})
	if err != nil {
		s.t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("SYNC")); err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		s.t.Fatal("fd store did not handle SYNC")
	}
}

// passEnv returns duplicates of the stored fds (for ExtraFiles) and the
// environment systemd would set with them; the caller closes the files.
func (s *fdStore) passEnv() ([]*os.File, map[string]string) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var files []*os.File
	var names []string
	for _, sf := range s.fds {
		fd, err := unix.FcntlInt(sf.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			s.t.Fatal(err)
		}
		files = append(files, os.NewFile(uintptr(fd), sf.name))
		names = append(names, sf.name)
	}
	return files, map[string]string{
		"LISTEN_FDS": strconv.Itoa(len(files)), "LISTEN_FDNAMES": strings.Join(names, ":"), envListenSelf: "1",
	}
}

func (s *fdStore) names() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, sf := range s.fds {
		out = append(out, sf.name)
	}
	return strings.Join(out, ",")
}

func (s *fdStore) file(name string) *os.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sf := range s.fds {
		if sf.name == name {
			return sf.f
		}
	}
	return nil
}

// warmSession dials socket and opens the test namespace; close ends both.
func warmSession(t *testing.T, socket string, bs int) (s *client.Session, close func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Socket: socket, Name: t.Name()})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	s, err = c.Open(ctx, testNS("warm", bs))
	if err != nil {
		c.Close()
		t.Fatalf("open: %v", err)
	}
	return s, func() { s.Close(); c.Close() }
}

// getAll reads every block of hs; it returns which were served, failing the
// test on any block served with other bytes than its payload.
func getAll(t *testing.T, s *client.Session, hs []client.Hash, bs int) []bool {
	t.Helper()
	dsts := make([][]byte, len(hs))
	for i := range dsts {
		dsts[i] = make([]byte, bs)
	}
	found, err := s.GetBatch(context.Background(), hs, dsts)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	for i := range hs {
		if found[i] && !bytes.Equal(dsts[i], payload(hs[i], bs)) {
			t.Fatalf("block %d served with wrong bytes", i)
		}
	}
	return found
}

// TestWarmRestart restarts a real kvtierd process under a fake systemd fd
// store: daemon #1 stores its host arena at start and an index snapshot at
// SIGTERM; one block's bytes are corrupted in the kept arena; daemon #2 gets
// both fds (LISTEN_FDS) and, with no NVMe tier to fall back on, must serve
// every other block byte-exact from the adopted arena and miss the
// corrupted one. Then #2 is SIGKILLed: the store holds the arena but no
// index, and daemon #3 adopts nothing.
func TestWarmRestart(t *testing.T) {
	dir := tmpDir(t)
	store := newFdStore(t, dir)
	const n, bs, bad = 128, 256 << 10, 5 // 32 MiB of blocks in a 64 MiB host tier
	hs := chain(4242, n)
	notify := map[string]string{"NOTIFY_SOCKET": store.path}

	d1 := daemonProc(t, dir, notify)
	s, done := warmSession(t, socketOf(dir), bs)
	blocks := make([][]byte, n)
	for i, h := range hs {
		blocks[i] = payload(h, bs)
	}
	stored, err := s.PutBatch(context.Background(), hs, blocks)
	if err != nil || stored != n {
		t.Fatalf("put: %d stored, %v", stored, err)
	}
	done()

	t0 := time.Now()
	if err := d1.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("daemon #1 exited with %v", err)
	}
	stopTook := time.Since(t0)
	store.sync()
	if got := store.names(); got != "kvtier-arena,kvtier-index" {
		t.Fatalf("fd store holds %q after SIGTERM, want the arena and the index", got)
	}

	// Corrupt one block in the kept arena (not timed).
	st, err := store.file("kvtier-arena").Stat()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(store.file("kvtier-arena").Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(mem, blocks[bad])
	if at < 0 {
		unix.Munmap(mem)
		t.Fatal("corruption target not found in the kept arena")
	}
	mem[at+bs-1] ^= 0x01
	unix.Munmap(mem)

	files, env := store.passEnv()
	env["NOTIFY_SOCKET"] = store.path
	env[envDir] = dir
	t1 := time.Now()
	d2 := startProcFiles(t, "kvtierd#2", "daemon", env, "READY", files)
	for _, f := range files {
		f.Close()
	}
	s, done = warmSession(t, socketOf(dir), bs)
	first := make([]byte, bs)
	if err := s.Get(context.Background(), hs[0], first); err != nil || !bytes.Equal(first, blocks[0]) {
		t.Fatalf("first get after restart: %v", err)
	}
	startTook := time.Since(t1)
	found := getAll(t, s, hs, bs)
	served := 0
	for i, ok := range found {
		switch {
		case i == bad && ok:
			t.Errorf("corrupted block %d was served", i)
		case i != bad && !ok:
			t.Errorf("block %d lost across the restart", i)
		case ok:
			served++
		}
	}
	done()
	t.Logf("warm restart: %d/%d blocks (%d MiB) served after restart; restart took %v (SIGTERM to exit %v, start to first get %v)",
		served, n, served*bs>>20, (stopTook + startTook).Round(time.Millisecond),
		stopTook.Round(time.Millisecond), startTook.Round(time.Millisecond))
	for _, l := range strings.Split(d1.stderr.String()+d2.stderr.String(), "\n") {
		if strings.Contains(l, "warm restart:") {
			t.Log(l)
		}
	}
	if !strings.Contains(d2.stderr.String(), "adopted_blocks="+strconv.Itoa(n-1)+" ") ||
		!strings.Contains(d2.stderr.String(), "dropped_checksum=1 ") {
		t.Errorf("daemon #2 did not log %d adopted blocks and 1 checksum drop", n-1)
	}
	store.sync()
	if got := store.names(); got != "kvtier-arena" {
		t.Fatalf("fd store holds %q while #2 serves, want the arena alone", got)
	}

	// Crash: no snapshot. The next start gets the arena alone, and
	// replaces it.
	d2.cmd.Process.Kill()
	<-d2.done
	store.sync()
	if got := store.names(); got != "kvtier-arena" {
		t.Fatalf("fd store holds %q after a crash, want the arena alone", got)
	}
	files, env = store.passEnv()
	env["NOTIFY_SOCKET"] = store.path
	env[envDir] = dir
	d3 := startProcFiles(t, "kvtierd#3", "daemon", env, "READY", files)
	for _, f := range files {
		f.Close()
	}
	s, done = warmSession(t, socketOf(dir), bs)
	found = getAll(t, s, hs, bs)
	done()
	for i, ok := range found {
		if ok {
			t.Errorf("block %d served after a crash without an index", i)
		}
	}
	// The crashed daemon's clients may still write into the kept arena
	// (a late device copy): #3 must discard it for a fresh one.
	if !strings.Contains(d3.stderr.String(), "discarding the host arena kept by systemd") ||
		strings.Contains(d3.stderr.String(), "using the host arena kept by systemd") {
		t.Errorf("daemon #3 did not discard the arena a crashed daemon left")
	}
	if err := d3.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("daemon #3 exited with %v", err)
	}
}
