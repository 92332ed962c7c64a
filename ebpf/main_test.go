package ebpf

import (
	"testing"

	"go.uber.org/goleak"
)

// Every loader's Close must leave no goroutine behind (the exit tracer's
// ring buffer reader included).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
