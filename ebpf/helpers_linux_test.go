package ebpf

import (
	"errors"
	"os"
	"testing"
)

// requireBPF skips unless the programs can load here: root (for
// CAP_BPF/CAP_PERFMON) and kernel BTF. CI runs the tests as root.
func requireBPF(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF and CAP_PERFMON) to load eBPF programs")
	}
	if err := (Env{}).Check(); err != nil {
		t.Skipf("eBPF environment incomplete: %v", err)
	}
}

// skipUnavailable skips on ErrUnavailable (a kernel without the
// tracepoint, say) and fails on anything else.
func skipUnavailable(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("not supported here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}
