package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// ExitEvent reports that the process (thread group) Tgid died.
type ExitEvent struct {
	Tgid uint32
	// At is when its last thread passed sched_process_exit (CLOCK_MONOTONIC,
	// as a time.Duration since boot).
	At time.Duration
}

// ExitTracer watches connected clients' processes for their exit. Add and
// Remove are safe for concurrent use; Read is for one goroutine.
type ExitTracer struct {
	objs exitObjects
	tp   link.Link
	rd   *ringbuf.Reader

	mu   sync.Mutex
	refs map[uint32]int // tgid → sessions watching it
}

// OpenExitTracer loads and attaches the exit program.
func OpenExitTracer(env Env) (*ExitTracer, error) {
	if err := env.prepare(); err != nil {
		return nil, err
	}
	spec, err := loadExit()
	if err != nil {
		return nil, err
	}
	// SO_PEERCRED pids are those of the daemon's pid namespace; outside
	// the initial one, the program translates into it.
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err == nil && st.Ino != initPidNSIno {
		if err := spec.Variables[exitVarPidnsDev].Set(uint64(st.Dev)); err != nil {
			return nil, err
		}
		if err := spec.Variables[exitVarPidnsIno].Set(st.Ino); err != nil {
			return nil, err
		}
	}
	t := &ExitTracer{refs: map[uint32]int{}}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		return nil, classify("load exit program", err)
	}
	if t.tp, err = attach("sched_process_exit", t.objs.HandleExit); err != nil {
		t.objs.Close()
		return nil, err
	}
	if t.rd, err = ringbuf.NewReader(t.objs.Exits); err != nil {
		closeAll(t.tp, &t.objs)
		return nil, classify("exit ring buffer", err)
	}
	return t, nil
}

// initPidNSIno is the inode number of the initial pid namespace
// (PROC_PID_INIT_INO).
const initPidNSIno = 0xEFFFFFFC

// Add starts watching tgid (one call per session; Remove undoes one).
func (t *ExitTracer) Add(tgid uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refs[tgid] == 0 {
		if err := t.objs.Clients.Put(tgid, uint32(1)); err != nil {
			return fmt.Errorf("watch pid %d: %w", tgid, err)
		}
	}
	t.refs[tgid]++
	return nil
}

// Remove stops one watch of tgid; the kernel filter drops it with the last.
func (t *ExitTracer) Remove(tgid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.refs[tgid]
	switch {
	case n == 0:
		return
	case n > 1:
		t.refs[tgid] = n - 1
		return
	}
	delete(t.refs, tgid)
	_ = t.objs.Clients.Delete(tgid) // absent already is fine
}

// Watched reports how many tgids the kernel filter holds.
func (t *ExitTracer) Watched() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.refs)
}

// Read blocks until a watched process dies; after Close it returns an
// error for which errors.Is(err, os.ErrClosed) holds. One death may be read
// twice: when the threads of a group exit at once (kill -9), two of them can
// both find the group's live count at zero at the tracepoint.
func (t *ExitTracer) Read() (ExitEvent, error) {
	for {
		rec, err := t.rd.Read()
		if err != nil {
			return ExitEvent{}, err
		}
		if len(rec.RawSample) < 16 {
			continue // not ours to trust blindly: skip short records
		}
		b := rec.RawSample
		return ExitEvent{Tgid: binary.NativeEndian.Uint32(b[0:4]), At: time.Duration(binary.NativeEndian.Uint64(b[8:16]))}, nil
	}
}

// Close detaches the program and frees its maps; a blocked Read returns.
func (t *ExitTracer) Close() error {
	err := closeAll(t.rd, t.tp, &t.objs)
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}
