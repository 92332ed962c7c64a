package ebpf

import (
	"errors"
	"fmt"
	"os"
)

// Program names, the label values of kvtier_ebpf_enabled{program}.
const (
	ProgExit   = "exit"
	ProgNVMeIO = "nvme_io"
	ProgVmscan = "vmscan"
)

// Programs lists every program the daemon may load.
var Programs = []string{ProgExit, ProgNVMeIO, ProgVmscan}

// ErrUnavailable is wrapped by every error that means "this kernel, these
// privileges or this configuration do not allow the program": the caller
// falls back. Anything else is a bug.
var ErrUnavailable = errors.New("ebpf unavailable")

// Env says where to look for the kernel features the programs need.
// Tests point it at missing paths to force the fallbacks.
type Env struct {
	// BTF is the kernel's BTF blob ("" means /sys/kernel/btf/vmlinux).
	BTF string
}

const defaultBTF = "/sys/kernel/btf/vmlinux"

func (e Env) btf() string {
	if e.BTF == "" {
		return defaultBTF
	}
	return e.BTF
}

// Check reports what the environment lacks for the programs: nil, or an
// error wrapping ErrUnavailable that names the missing feature and how to
// provide it. The programs are BTF-enabled raw tracepoints, attached by
// BTF id: they need the kernel's BTF but not tracefs. Check does not need
// privileges; the load itself reports missing capabilities.
func (e Env) Check() error {
	if _, err := os.Stat(e.btf()); err != nil {
		return fmt.Errorf("%w: kernel BTF missing (%s: %v; needs CONFIG_DEBUG_INFO_BTF=y)", ErrUnavailable, e.btf(), err)
	}
	return nil
}
