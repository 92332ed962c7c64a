package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Op indexes the I/O latency histograms.
const (
	OpRead  = 0
	OpWrite = 1
)

// OpNames are the label values of kvtier_nvme_io_latency_seconds{op}.
var OpNames = [2]string{"read", "write"}

// nSlots is the number of log2 slots of a histogram (struct hist).
const nSlots = 64

// Histogram is one operation's latencies: Slots[i] counts those in
// [2^i, 2^(i+1)) nanoseconds.
type Histogram struct {
	Slots [nSlots]uint64
	Count uint64
	SumNs uint64
}

// IOLatency times the block requests of one disk.
type IOLatency struct {
	objs   nvmeioObjects
	issue  link.Link
	done   link.Link
	Device Device
}

// Device is a disk as the block layer names it.
type Device struct {
	Major, Minor uint32
	Name         string // e.g. "vda", "nvme0n1"
}

func (d Device) String() string { return fmt.Sprintf("%s (%d:%d)", d.Name, d.Major, d.Minor) }

// kernelDev encodes the device as the kernel's internal dev_t
// (MKDEV: major<<20 | minor), which is what the block tracepoints report.
func (d Device) kernelDev() uint32 { return d.Major<<20 | d.Minor }

// DiskOf returns the disk that backs the filesystem holding path: a
// partition resolves to its whole disk, which the block layer reports.
// Filesystems with no block device of their own (tmpfs, overlay, NFS)
// fail with ErrUnavailable.
func DiskOf(path string) (Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Device{}, err
	}
	maj, min := unix.Major(st.Dev), unix.Minor(st.Dev)
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", maj, min)
	real, err := filepath.EvalSymlinks(sys)
	if err != nil {
		return Device{}, fmt.Errorf("%w: %s is on device %d:%d, which is not a block device (%v)", ErrUnavailable, path, maj, min, err)
	}
	if _, err := os.Stat(filepath.Join(real, "partition")); err == nil {
		real = filepath.Dir(real) // .../block/vda/vda1 → .../block/vda
	}
	b, err := os.ReadFile(filepath.Join(real, "dev"))
	if err != nil {
		return Device{}, err
	}
	a, c, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	ma, err1 := strconv.ParseUint(a, 10, 32)
	mi, err2 := strconv.ParseUint(c, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return Device{}, fmt.Errorf("parse %s/dev: %q", real, b)
	}
	return Device{Major: uint32(ma), Minor: uint32(mi), Name: filepath.Base(real)}, nil
}

// OpenIOLatency loads the block request programs for dev and attaches them.
func OpenIOLatency(env Env, dev Device) (*IOLatency, error) {
	if err := env.prepare(); err != nil {
		return nil, err
	}
	spec, err := loadNvmeio()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[nvmeioVarTargetDev].Set(dev.kernelDev()); err != nil {
		return nil, err
	}
	hasQueue, err := issueHasQueue()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[nvmeioVarIssueHasQueue].Set(hasQueue); err != nil {
		return nil, err
	}
	l := &IOLatency{Device: dev}
	if err := spec.LoadAndAssign(&l.objs, nil); err != nil {
		return nil, classify("load nvme_io programs", err)
	}
	if l.issue, err = attach("block_rq_issue", l.objs.HandleIssue); err != nil {
		l.objs.Close()
		return nil, err
	}
	if l.done, err = attach("block_rq_complete", l.objs.HandleComplete); err != nil {
		closeAll(l.issue, &l.objs)
		return nil, err
	}
	return l, nil
}

// issueHasQueue reports whether the kernel's block_rq_issue tracepoint
// takes the request queue before the request (TP_PROTO(q, rq), before
// 5.11) rather than the request alone: the program reads the request from
// the argument slot the kernel's BTF says.
func issueHasQueue() (bool, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false, classify("load kernel BTF", err)
	}
	const name = "btf_trace_block_rq_issue"
	var td *btf.Typedef
	if err := spec.TypeByName(name, &td); err != nil {
		return false, classify("find "+name+" in kernel BTF", err)
	}
	ptr, ok := td.Type.(*btf.Pointer)
	var proto *btf.FuncProto
	if ok {
		proto, ok = ptr.Target.(*btf.FuncProto)
	}
	if !ok {
		return false, fmt.Errorf("%w: %s is %v, not a function pointer", ErrUnavailable, name, td.Type)
	}
	// The first parameter is the tracepoint's data pointer, then TP_PROTO's.
	switch len(proto.Params) {
	case 2:
		return false, nil
	case 3:
		return true, nil
	}
	return false, fmt.Errorf("%w: %s takes %d arguments, want (data, rq) or (data, q, rq)", ErrUnavailable, name, len(proto.Params))
}

// Read copies the histogram of op (OpRead, OpWrite) out of the kernel.
func (l *IOLatency) Read(op int) (Histogram, error) {
	var h nvmeioHist
	if err := l.objs.Hists.Lookup(uint32(op), &h); err != nil {
		return Histogram{}, err
	}
	return Histogram{Slots: h.Slots, Count: h.Count, SumNs: h.SumNs}, nil
}

// Close detaches the programs and frees the maps.
func (l *IOLatency) Close() error {
	err := closeAll(l.done, l.issue, &l.objs)
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}
