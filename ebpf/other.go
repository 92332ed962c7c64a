//go:build !linux

package ebpf

import (
	"fmt"
	"runtime"
	"time"
)

var errOS = fmt.Errorf("%w: eBPF tracing needs Linux (this is %s)", ErrUnavailable, runtime.GOOS)

// ExitEvent reports that the process (thread group) Tgid died.
type ExitEvent struct {
	Tgid uint32
	At   time.Duration
}

// ExitTracer is Linux-only.
type ExitTracer struct{}

// OpenExitTracer fails: eBPF needs Linux.
func OpenExitTracer(Env) (*ExitTracer, error) { return nil, errOS }
func (*ExitTracer) Add(uint32) error          { return errOS }
func (*ExitTracer) Remove(uint32)             {}
func (*ExitTracer) Watched() int              { return 0 }
func (*ExitTracer) Read() (ExitEvent, error)  { return ExitEvent{}, errOS }
func (*ExitTracer) Close() error              { return nil }

// Op indexes the I/O latency histograms.
const (
	OpRead  = 0
	OpWrite = 1
)

// OpNames are the label values of kvtier_nvme_io_latency_seconds{op}.
var OpNames = [2]string{"read", "write"}

const nSlots = 64

// Histogram is one operation's latencies.
type Histogram struct {
	Slots [nSlots]uint64
	Count uint64
	SumNs uint64
}

// Device is a disk as the block layer names it.
type Device struct {
	Major, Minor uint32
	Name         string
}

func (d Device) String() string { return fmt.Sprintf("%s (%d:%d)", d.Name, d.Major, d.Minor) }

// MaxDisks bounds the disks one IOLatency watches.
const MaxDisks = 16

// DisksOf fails: eBPF needs Linux.
func DisksOf(string) ([]Device, error) { return nil, errOS }

// IOLatency is Linux-only.
type IOLatency struct{ Devices []Device }

// OpenIOLatency fails: eBPF needs Linux.
func OpenIOLatency(Env, []Device) (*IOLatency, error) { return nil, errOS }
func (*IOLatency) Read(int) (Histogram, error)        { return Histogram{}, errOS }
func (*IOLatency) Close() error                       { return nil }

// ReclaimStats counts direct-reclaim stalls.
type ReclaimStats struct {
	Stalls    uint64
	StallTime time.Duration
}

// ReclaimProbe is Linux-only.
type ReclaimProbe struct{}

// OpenReclaimProbe fails: eBPF needs Linux.
func OpenReclaimProbe(Env) (*ReclaimProbe, error) { return nil, errOS }
func (*ReclaimProbe) Read() (ReclaimStats, error) { return ReclaimStats{}, errOS }
func (*ReclaimProbe) Close() error                { return nil }
