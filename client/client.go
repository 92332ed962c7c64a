package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvtier/kvtier/cudaipc"
	"github.com/kvtier/kvtier/shm"
)

// Re-exported wire types, so users need not import shm.
type (
	Namespace = shm.Namespace
	Tier      = shm.Tier
	Stats     = shm.Stats
)

const (
	TierNone = shm.TierNone
	TierGPU  = shm.TierGPU
	TierHost = shm.TierHost
	TierNVMe = shm.TierNVMe
)

var (
	// ErrNotFound: the block is not cached.
	ErrNotFound = errors.New("kvtier: block not cached")
	// ErrFull: every slot of the tier is leased or reserved.
	ErrFull = errors.New("kvtier: tier full of leased or reserved blocks")
	// ErrDisconnected: the connection to kvtierd was lost (daemon restart or
	// the daemon closed the session). The next call reconnects.
	ErrDisconnected = errors.New("kvtier: connection to kvtierd lost")
	// ErrClosed: the session or client was closed.
	ErrClosed = errors.New("kvtier: session closed")
	// ErrDone: the reservation was already committed/aborted, or the lease
	// already released.
	ErrDone = errors.New("kvtier: reservation or lease already finished")
	// ErrBlockSize: a buffer does not match the namespace's block size.
	ErrBlockSize = errors.New("kvtier: buffer size differs from the namespace block size")
)

// RefusedError is the daemon's reason for refusing a connection.
type RefusedError struct {
	Code    shm.ErrCode
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("kvtierd refused the connection (code %d): %s", e.Code, e.Message)
}

// Options configure a Client. The zero value works against a daemon on
// embedded defaults.
type Options struct {
	// Socket is the daemon's control socket; default $KVTIER_SOCKET or the
	// daemon's default path (for a user other than root, whose directory
	// must be owned by that user or root, as the daemon requires).
	Socket string
	// Name identifies this client in the daemon's logs.
	Name string
	// DialTimeout bounds connect + handshake; default 5s.
	DialTimeout time.Duration
	// Spin is how long a waiting session polls its completion ring before
	// sleeping; default 50µs, and 20 times that while other calls of the
	// process are waiting too. Only its own polling counts: while it yields
	// to the process's other goroutines or to other threads (the daemon),
	// the clock stops. Longer lowers latency and burns more CPU.
	Spin time.Duration
	// NoPopulate skips building the page tables of the arena mapping at
	// connect (faster connect, slower first copies).
	NoPopulate bool
	// ProtocolVersion overrides the version sent (tests only).
	ProtocolVersion uint16
	// Device is this process's GPU (caller-owned). With it (or GPU) the
	// session opens the daemon's arena on that GPU (matched by UUID) and
	// registers the host arena as pinned: see PutFromDevice, GetToDevice.
	Device cudaipc.Device
	// GPU names the GPU when Device is nil: an ordinal ("0") or a UUID
	// ("GPU-xxxxxxxx-..."); the client opens it and closes it with Close
	// (or, with leases still open then, once the last is released).
	GPU string
}

// Client is a handle on one kvtierd. It is safe for concurrent use.
type Client struct {
	opts   Options
	dev    cudaipc.Device // opts.Device, or the one GPU opened
	ownDev bool           // (mu)
	// ownDir is set when opts.Socket is a non-root user's default path,
	// whose directory (/tmp/kvtier-<uid> without $XDG_RUNTIME_DIR) any
	// local user may have created: it must be euid's or root's (see
	// shm.CheckSocketDir), checked at every connect.
	ownDir bool
	euid   int

	mu       sync.Mutex
	sessions map[*Session]struct{}
	closed   bool

	// Device ops in flight, per stream, each stream finished by a goroutine
	// of its own while it has any (device.go); and a pool of events.
	qmu          sync.Mutex
	queues       map[cudaipc.Stream]*streamQueue
	events       []cudaipc.Event
	eventsClosed bool

	// devUsers counts the connections holding the daemon's GPU arena
	// mapped (and the host arena pinned) through dev; a GPU the client
	// opened is closed by the last of Close and those (devMu).
	devMu      sync.Mutex
	devUsers   int
	devClosing bool
}

// Dial checks that the daemon answers and returns a Client for it.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	euid, ownDir := os.Geteuid(), false
	if opts.Socket == "" {
		opts.Socket = shm.DefaultSocket()
		ownDir = euid != 0 && os.Getenv("KVTIER_SOCKET") == ""
	}
	if opts.Name == "" {
		opts.Name = filepath.Base(os.Args[0])
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.Spin == 0 {
		opts.Spin = 50 * time.Microsecond
	}
	if opts.ProtocolVersion == 0 {
		opts.ProtocolVersion = shm.ProtocolVersion
	}
	c := &Client{opts: opts, sessions: map[*Session]struct{}{}, dev: opts.Device, queues: map[cudaipc.Stream]*streamQueue{},
		ownDir: ownDir, euid: euid}
	if c.dev == nil && opts.GPU != "" {
		dev, err := openGPU(opts.GPU)
		if err != nil {
			return nil, err
		}
		c.dev, c.ownDev = dev, true
	}
	ac, err := c.dialAdmin(ctx)
	if err != nil {
		if c.ownDev {
			c.dev.Close()
		}
		return nil, err
	}
	ac.Close()
	return c, nil
}

// Socket is the control socket this client uses.
func (c *Client) Socket() string { return c.opts.Socket }

// Open starts a session for namespace ns.
func (c *Client) Open(ctx context.Context, ns Namespace) (*Session, error) {
	if err := ns.Validate(); err != nil {
		return nil, err
	}
	s := &Session{c: c, ns: ns, closeDone: make(chan struct{})}
	s.closing, s.endClosing = context.WithCancel(context.Background())
	cn, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	// Set before s is published: a concurrent Close must find (and kill) it.
	s.cur = cn
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cn.kill(ErrClosed)
		cn.wait()
		return nil, ErrClosed
	}
	c.sessions[s] = struct{}{}
	c.mu.Unlock()
	return s, nil
}

// Close closes every session opened by this client.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	ss := make([]*Session, 0, len(c.sessions))
	for s := range c.sessions {
		ss = append(ss, s)
	}
	ownDev := c.ownDev // the first Close closes the GPU it opened
	c.ownDev = false
	c.mu.Unlock()
	for _, s := range ss {
		s.Close() // waits for the session's device ops
	}
	c.closeEvents()
	if ownDev {
		// Leases still open keep their mappings, which need the device
		// to be unmapped: the last of them closes it (devDone).
		c.devMu.Lock()
		c.devClosing = true
		idle := c.devUsers == 0
		c.devMu.Unlock()
		if idle {
			c.dev.Close()
		}
	}
	return nil
}

// devUse counts a connection that mapped the daemon's GPU arena through
// c.dev; devDone ends it once the mapping is closed.
func (c *Client) devUse() {
	c.devMu.Lock()
	c.devUsers++
	c.devMu.Unlock()
}

func (c *Client) devDone() {
	c.devMu.Lock()
	c.devUsers--
	last := c.devUsers == 0 && c.devClosing
	c.devMu.Unlock()
	if last {
		c.dev.Close()
	}
}

func (c *Client) forget(s *Session) {
	c.mu.Lock()
	delete(c.sessions, s)
	c.mu.Unlock()
}

// handshake connects and exchanges Hello/Welcome. It returns the socket,
// the Welcome and the fds that came with it (owned by the caller).
func (c *Client) handshake(ctx context.Context, h shm.Hello, wantFDs int) (*net.UnixConn, shm.Welcome, []int, error) {
	if c.ownDir {
		if err := shm.CheckSocketDir(filepath.Dir(c.opts.Socket), c.euid); err != nil {
			if errors.Is(err, shm.ErrSocketDirUnsafe) {
				err = fmt.Errorf("kvtier: refusing to connect: %w: another user's daemon may listen there (name the socket with $KVTIER_SOCKET or Options.Socket)", err)
			} else {
				err = fmt.Errorf("%w: %v", ErrDisconnected, err)
			}
			return nil, shm.Welcome{}, nil, err
		}
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", c.opts.Socket)
	if err != nil {
		if perr := parent.Err(); perr != nil {
			return nil, shm.Welcome{}, nil, fmt.Errorf("%w: dial %s: %w", ErrDisconnected, c.opts.Socket, perr)
		}
		return nil, shm.Welcome{}, nil, fmt.Errorf("%w: dial %s: %v", ErrDisconnected, c.opts.Socket, err)
	}
	uc := nc.(*net.UnixConn)
	// A daemon stopped mid-handshake (SIGSTOP) would otherwise hold the
	// caller for DialTimeout after it cancelled.
	stop := endOnCancel(ctx, uc)
	fail := func(err error) (*net.UnixConn, shm.Welcome, []int, error) {
		stop()
		uc.Close()
		if perr := parent.Err(); perr != nil && errors.Is(err, ErrDisconnected) {
			// The caller's context ended it, not the daemon.
			err = fmt.Errorf("%w (%w)", err, perr)
		}
		return nil, shm.Welcome{}, nil, err
	}
	dl, _ := ctx.Deadline()
	uc.SetDeadline(dl)
	if err := shm.SendMsg(uc, shm.EncodeMsg(shm.MsgHello, c.opts.ProtocolVersion, h.Encode())); err != nil {
		return fail(fmt.Errorf("%w: send hello: %v", ErrDisconnected, err))
	}
	buf := make([]byte, shm.MaxControlMsg)
	raw, fds, err := shm.RecvMsg(uc, buf, wantFDs)
	if err != nil {
		return fail(fmt.Errorf("%w: handshake: %v", ErrDisconnected, err))
	}
	closeFDs := func() {
		for _, fd := range fds {
			closeFD(fd)
		}
	}
	t, ver, payload, err := shm.DecodeMsg(raw)
	if err != nil {
		closeFDs()
		return fail(err)
	}
	switch t {
	case shm.MsgError:
		// Read whatever its version: a daemon that does not speak ours
		// says so in one (CodeVersion).
		closeFDs()
		e, err := shm.DecodeError(payload)
		if err != nil {
			return fail(err)
		}
		return fail(&RefusedError{Code: e.Code, Message: e.Message})
	case shm.MsgWelcome:
		// A Welcome is laid out in its own version: one of another is
		// not read as ours.
		if ver != c.opts.ProtocolVersion {
			closeFDs()
			return fail(fmt.Errorf("%w: kvtierd answered in protocol version %d, this client speaks %d (upgrade the older of the two)",
				shm.ErrMalformed, ver, c.opts.ProtocolVersion))
		}
	default:
		closeFDs()
		return fail(fmt.Errorf("%w: expected welcome, got message type %d", shm.ErrMalformed, t))
	}
	w, err := shm.DecodeWelcome(payload)
	if err == nil && len(fds) != wantFDs {
		err = fmt.Errorf("%w: welcome carried %d fds, expected %d", shm.ErrMalformed, len(fds), wantFDs)
	}
	if err != nil {
		closeFDs()
		return fail(err)
	}
	if !stop() {
		// Cancelled just now: its past deadline may land after any reset.
		closeFDs()
		return fail(fmt.Errorf("%w: handshake: %v", ErrDisconnected, context.Cause(ctx)))
	}
	uc.SetDeadline(time.Time{})
	return uc, w, fds, nil
}

func (c *Client) dialAdmin(ctx context.Context) (*net.UnixConn, error) {
	uc, _, _, err := c.handshake(ctx, shm.Hello{PID: uint32(os.Getpid()), Flags: shm.HelloFlagAdmin, Name: c.opts.Name}, 0)
	return uc, err
}

// endOnCancel ends uc's pending and later I/O when ctx is cancelled (a
// deadline covers only ctx's deadline) by setting a past deadline; stop as
// context.AfterFunc's.
func endOnCancel(ctx context.Context, uc *net.UnixConn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { uc.SetDeadline(time.Unix(1, 0)) })
}

// adminCall sends one control request on a fresh admin connection and
// returns the reply's payload.
func (c *Client) adminCall(ctx context.Context, t shm.MsgType, payload []byte, want shm.MsgType) ([]byte, error) {
	uc, err := c.dialAdmin(ctx)
	if err != nil {
		return nil, err
	}
	defer uc.Close()
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	} else {
		uc.SetDeadline(time.Now().Add(c.opts.DialTimeout))
	}
	// Without it a cancelled Flush waited for the daemon's answer (up to
	// two minutes).
	stop := endOnCancel(ctx, uc)
	defer stop()
	ioErr := func(err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("%w: %v (%w)", ErrDisconnected, err, cerr)
		}
		return fmt.Errorf("%w: %v", ErrDisconnected, err)
	}
	if err := shm.SendMsg(uc, shm.EncodeMsg(t, c.opts.ProtocolVersion, payload)); err != nil {
		return nil, ioErr(err)
	}
	buf := make([]byte, shm.MaxControlMsg)
	raw, _, err := shm.RecvMsg(uc, buf, 0)
	if err != nil {
		return nil, ioErr(err)
	}
	rt, _, p, err := shm.DecodeMsg(raw)
	if err != nil {
		return nil, err
	}
	if rt != want {
		return nil, fmt.Errorf("%w: expected message type %d, got %d", shm.ErrMalformed, want, rt)
	}
	return p, nil
}

// Stats returns the daemon's status report.
func (c *Client) Stats(ctx context.Context) (*Stats, error) {
	p, err := c.adminCall(ctx, shm.MsgStatsReq, nil, shm.MsgStatsReply)
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	st, err := shm.DecodeStats(p)
	if err != nil {
		return nil, fmt.Errorf("stats: decode reply: %w", err)
	}
	return &st, nil
}

// Evict drops every unleased block of namespace id (all namespaces when all
// is set), the blocks of its parked requests included, and returns how
// many blocks went.
func (c *Client) Evict(ctx context.Context, namespaceID uint32, all bool) (int, error) {
	req := shm.EvictReq{NamespaceID: namespaceID, All: all}
	p, err := c.adminCall(ctx, shm.MsgEvictReq, req.Encode(), shm.MsgEvictReply)
	if err != nil {
		return 0, fmt.Errorf("evict: %w", err)
	}
	var r struct{ Evicted int }
	if err := json.Unmarshal(p, &r); err != nil {
		return 0, fmt.Errorf("evict: decode reply: %w", err)
	}
	return r.Evicted, nil
}

// flushWait bounds a Flush whose context has no deadline: the daemon stops
// writing after 60 s and answers with what it wrote.
const flushWait = 2 * time.Minute

// Flush asks the daemon to write every host-tier block that has no copy in
// NVMe down to NVMe (the host tier keeps its copies) and returns how many
// blocks it wrote. Without an NVMe tier it writes nothing and returns 0. The
// daemon bounds the write-down; if it stops early, or writes fail, Flush
// returns the blocks written with an error. Without a deadline on ctx, Flush waits for
// that answer (up to two minutes), not just Options.DialTimeout.
func (c *Client) Flush(ctx context.Context) (int, error) {
	if _, ok := ctx.Deadline(); !ok {
		// Not DialTimeout, a control call's bound: wait for the daemon's.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, flushWait)
		defer cancel()
	}
	p, err := c.adminCall(ctx, shm.MsgFlushReq, nil, shm.MsgFlushReply)
	if err != nil {
		return 0, fmt.Errorf("flush: %w", err)
	}
	var r struct {
		Blocks int    `json:"blocks"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal(p, &r); err != nil {
		return 0, fmt.Errorf("flush: decode reply: %w", err)
	}
	if r.Error != "" {
		return r.Blocks, fmt.Errorf("flush: %d blocks written: %s", r.Blocks, r.Error)
	}
	return r.Blocks, nil
}
