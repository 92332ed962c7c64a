package ebpf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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

// IOLatency times the block requests of a set of disks.
type IOLatency struct {
	objs    nvmeioObjects
	issue   link.Link
	done    link.Link
	Devices []Device
}

// Device is a disk as the block layer names it.
type Device struct {
	Major, Minor uint32
	Name         string // e.g. "vda", "nvme0n1", "nvme0c1n1"
	// PathOf is, for a path disk of an NVMe multipath namespace, the
	// multipath head it serves ("nvme0n1"). Such a disk is hidden: the
	// kernel gives it no device number (no sysfs dev file; Major and Minor
	// are 0), and the probe matches its requests by Name.
	PathOf string
}

func (d Device) String() string {
	if d.PathOf != "" {
		return fmt.Sprintf("%s (path of %s)", d.Name, d.PathOf)
	}
	return fmt.Sprintf("%s (%d:%d)", d.Name, d.Major, d.Minor)
}

// kernelDev encodes the device as the kernel's internal dev_t
// (MKDEV: major<<20 | minor), which is what the block tracepoints report.
func (d Device) kernelDev() uint32 { return d.Major<<20 | d.Minor }

// MaxDisks bounds the disks one IOLatency watches (the size of the BPF
// program's set, struct targets in bpf/nvmeio.c).
const MaxDisks = 16

// maxStackNodes bounds the block devices DisksOf visits on its way down a
// stack (device-mapper over md over partitions...).
const maxStackNodes = 64

// DisksOf returns the disks whose block requests serve the filesystem
// holding path: the disk itself (a partition resolves to its whole disk,
// which the block layer reports), or, for a stacked volume (device-mapper,
// LVM, md RAID: bio-based, with no requests of their own), the whole disks
// found by following sysfs's slaves links down the stack, deduplicated, in
// sysfs order. An NVMe native multipath head (nvme0n1, bio-based too, alone
// or under such a stack) resolves to its path disks (nvme0c0n1,
// nvme0c1n1...), which carry its requests (see multipathPaths).
// Filesystems with no block device of their own (tmpfs, overlay, NFS) and
// stacks over more than MaxDisks disks fail with ErrUnavailable.
func DisksOf(path string) ([]Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, err
	}
	devs, err := disksOf("/sys", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err != nil {
		return nil, fmt.Errorf("disks of %s: %w", path, err)
	}
	return devs, nil
}

// disksOf resolves the block device maj:min to the whole disks under it in
// the sysfs tree at sysfs (a parameter for tests).
func disksOf(sysfs string, maj, min uint32) ([]Device, error) {
	link := filepath.Join(sysfs, "dev", "block", fmt.Sprintf("%d:%d", maj, min))
	node, err := filepath.EvalSymlinks(link)
	if err != nil {
		return nil, fmt.Errorf("%w: device %d:%d is not a block device (%v)", ErrUnavailable, maj, min, err)
	}
	r := stackResolver{state: map[string]int{}, seen: map[Device]bool{}}
	if err := r.visit(node); err != nil {
		return nil, err
	}
	return r.disks, nil
}

type stackResolver struct {
	state map[string]int // node → visiting (1) or done (2)
	seen  map[Device]bool
	disks []Device
}

// visit adds the whole disks under node, a block device's sysfs directory
// with its symlinks resolved.
func (r *stackResolver) visit(node string) error {
	if _, err := os.Stat(filepath.Join(node, "partition")); err == nil {
		node = filepath.Dir(node) // .../block/vda/vda1 → .../block/vda
	}
	switch r.state[node] {
	case 1:
		return fmt.Errorf("%w: block device stack has a cycle through %s", ErrUnavailable, node)
	case 2:
		return nil // reached twice (a diamond): its disks are in already
	}
	if len(r.state) >= maxStackNodes {
		return fmt.Errorf("%w: block device stack has more than %d devices", ErrUnavailable, maxStackNodes)
	}
	r.state[node] = 1
	slaves, err := os.ReadDir(filepath.Join(node, "slaves"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read %s/slaves: %w", node, err)
	}
	if len(slaves) == 0 {
		paths, err := multipathPaths(node)
		if err != nil {
			return err
		}
		if len(paths) == 0 {
			dev, err := readDevice(node)
			if err != nil {
				return err
			}
			if err := r.add(dev); err != nil {
				return err
			}
		}
		for _, p := range paths {
			// A path disk is a leaf: its links are not followed further.
			if len(r.state) >= maxStackNodes {
				return fmt.Errorf("%w: block device stack has more than %d devices", ErrUnavailable, maxStackNodes)
			}
			if r.state[p] == 0 {
				r.state[p] = 2
			}
			dev, err := readPathDevice(p, filepath.Base(node))
			if err != nil {
				return err
			}
			if err := r.add(dev); err != nil {
				return err
			}
		}
	}
	for _, s := range slaves {
		below, err := filepath.EvalSymlinks(filepath.Join(node, "slaves", s.Name()))
		if err != nil {
			return fmt.Errorf("resolve %s/slaves/%s: %w", node, s.Name(), err)
		}
		if err := r.visit(below); err != nil {
			return err
		}
	}
	r.state[node] = 2
	return nil
}

// add appends dev to the disks unless it is there already.
func (r *stackResolver) add(dev Device) error {
	if r.seen[dev] {
		return nil
	}
	if len(r.disks) == MaxDisks {
		return fmt.Errorf("%w: the volume spans more than %d disks, more than the probe watches", ErrUnavailable, MaxDisks)
	}
	r.seen[dev] = true
	r.disks = append(r.disks, dev)
	return nil
}

// multipathPaths returns the sysfs directories (symlinks resolved) of the
// path disks of node, if node is an NVMe native multipath head; none
// otherwise, or while the head has no path yet.
//
// With CONFIG_NVME_MULTIPATH a namespace that several controllers share
// (or any, with nvme_core.multipath_always_on) gets a head disk, nvmeSnN
// under /sys/devices/virtual/nvme-subsystem/nvme-subsysS/, whose
// submit_bio (drivers/nvme/host/multipath.c, nvme_ns_head_submit_bio)
// sends each bio on to one path's disk (bio_set_dev(bio,
// ns->disk->part0)): the requests, and the block_rq_* tracepoints, carry
// the path disk, nvmeScCnN, a child of controller nvmeC, named so by
// nvme_alloc_ns (drivers/nvme/host/core.c). Those path disks are not in
// the head's slaves/. Since 6.15 the head lists them in its multipath/
// directory, symlinks to the path disks' sysfs directories
// (nvme_mpath_add_sysfs_link, called from nvme_mpath_set_live via
// nvme_mpath_add_disk; the group is nvme_ns_mpath_attr_group in
// drivers/nvme/host/sysfs.c). Older kernels have no such links: there the
// subsystem's directory links to its controllers (nvme_init_subsystem),
// and the path disks of head nvmeSnN are the controllers' children named
// nvmeScCnN.
func multipathPaths(node string) ([]string, error) {
	var paths []string
	dir := filepath.Join(node, "multipath")
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 {
			continue // an attribute file, not a path
		}
		p, err := filepath.EvalSymlinks(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("resolve %s/%s: %w", dir, e.Name(), err)
		}
		paths = append(paths, p)
	}
	if len(paths) > 0 || err == nil {
		return paths, nil
	}
	// No multipath/ (before 6.15): the controllers of the head's subsystem.
	subsys := filepath.Dir(node)
	if filepath.Base(filepath.Dir(subsys)) != "nvme-subsystem" {
		return nil, nil
	}
	head := filepath.Base(node)
	si, ni, ok := strings.Cut(strings.TrimPrefix(head, "nvme"), "n")
	if !ok || !strings.HasPrefix(head, "nvme") || !isDigits(si) || !isDigits(ni) {
		return nil, nil
	}
	ctrls, err := os.ReadDir(subsys)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subsys, err)
	}
	for _, c := range ctrls {
		ci, isCtrl := strings.CutPrefix(c.Name(), "nvme")
		if c.Type()&fs.ModeSymlink == 0 || !isCtrl || !isDigits(ci) {
			continue
		}
		name := "nvme" + si + "c" + ci + "n" + ni
		p, err := filepath.EvalSymlinks(filepath.Join(subsys, c.Name(), name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // this controller has no path to the namespace
		}
		if err != nil {
			return nil, fmt.Errorf("resolve %s/%s/%s: %w", subsys, c.Name(), name, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// readPathDevice describes the path disk at node of multipath head head:
// by its number if sysfs gives one, else by its name, which the probe then
// matches (a hidden disk has no dev file).
func readPathDevice(node, head string) (Device, error) {
	if _, err := os.Stat(filepath.Join(node, "dev")); err == nil {
		return readDevice(node)
	}
	name := filepath.Base(node)
	if len(name) >= diskNameLen {
		return Device{}, fmt.Errorf("path disk name %q of %s is longer than the kernel's disk names", name, head)
	}
	return Device{Name: name, PathOf: head}, nil
}

// diskNameLen is the size of gendisk.disk_name (DISK_NAME_LEN), NUL
// included.
const diskNameLen = 32

// readDevice reads a whole disk's number from its sysfs directory.
func readDevice(node string) (Device, error) {
	b, err := os.ReadFile(filepath.Join(node, "dev"))
	if err != nil {
		return Device{}, fmt.Errorf("read device number: %w", err)
	}
	a, c, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	ma, err1 := strconv.ParseUint(a, 10, 32)
	mi, err2 := strconv.ParseUint(c, 10, 32)
	if !ok || err1 != nil || err2 != nil || ma >= 1<<12 || mi >= 1<<20 {
		return Device{}, fmt.Errorf("parse %s/dev: %q", node, b)
	}
	return Device{Major: uint32(ma), Minor: uint32(mi), Name: filepath.Base(node)}, nil
}

// OpenIOLatency loads the block request programs for devs (1 to MaxDisks
// disks, as DisksOf returns them) and attaches them.
func OpenIOLatency(env Env, devs []Device) (*IOLatency, error) {
	if len(devs) == 0 || len(devs) > MaxDisks {
		return nil, fmt.Errorf("open nvme_io: %d disks, want 1 to %d", len(devs), MaxDisks)
	}
	if err := env.prepare(); err != nil {
		return nil, err
	}
	spec, err := loadNvmeio()
	if err != nil {
		return nil, err
	}
	hasQueue, err := issueHasQueue()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[nvmeioVarIssueHasQueue].Set(hasQueue); err != nil {
		return nil, err
	}
	byName := slices.ContainsFunc(devs, func(d Device) bool { return d.PathOf != "" })
	if err := spec.Variables[nvmeioVarMatchNames].Set(byName); err != nil {
		return nil, err
	}
	l := &IOLatency{Devices: slices.Clone(devs)}
	if err := spec.LoadAndAssign(&l.objs, nil); err != nil {
		return nil, classify("load nvme_io programs", err)
	}
	// The set is filled before the programs attach: they see every disk
	// from their first request.
	for _, d := range devs {
		var err error
		if d.PathOf != "" {
			var k nvmeioNameKey
			for i := range min(len(d.Name), diskNameLen-1) {
				k.Name[i] = int8(d.Name[i])
			}
			err = l.objs.TargetNames.Put(&k, uint8(1))
		} else {
			err = l.objs.Targets.Put(d.kernelDev(), uint8(1))
		}
		if err != nil {
			l.objs.Close()
			return nil, fmt.Errorf("watch %s: %w", d, err)
		}
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
