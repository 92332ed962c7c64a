package ebpf

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

var memlockOnce sync.Once

// prepare checks the environment and lifts RLIMIT_MEMLOCK for kernels that
// still charge BPF memory to it (before 5.11; harmless after).
func (e Env) prepare() error {
	if err := e.Check(); err != nil {
		return err
	}
	memlockOnce.Do(func() { _ = rlimit.RemoveMemlock() })
	return nil
}

// classify wraps the errors that mean "not allowed here" in ErrUnavailable
// with the reason an operator can act on.
func classify(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: %s: missing CAP_BPF/CAP_PERFMON (run as root or grant them): %v", ErrUnavailable, what, err)
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, btf.ErrNotFound),
		errors.Is(err, unix.ENOENT), errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%w: %s: not supported by this kernel: %v", ErrUnavailable, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// attach links prog to the BTF-enabled raw tracepoint its tp_btf section
// names (resolved by BTF id at load). Unlike link.Tracepoint this needs no
// tracefs, whose event ids only root may read: CAP_BPF and CAP_PERFMON are
// enough.
func attach(name string, prog *ebpf.Program) (link.Link, error) {
	l, err := link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceRawTp})
	if err != nil {
		return nil, classify("attach tp_btf/"+name, err)
	}
	return l, nil
}

// closeAll closes what is non-nil, in order.
func closeAll(cs ...interface{ Close() error }) error {
	var errs []error
	for _, c := range cs {
		if c == nil {
			continue
		}
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
