package daemon

import (
	"runtime"
	"testing"
)

// TestProcSizer: Ps follow the sessions beyond the CPUs, within bounds, and
// come back when they close; a GOMAXPROCS setting is left alone.
func TestProcSizer(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(orig)
	runtime.GOMAXPROCS(2)
	t.Setenv("GOMAXPROCS", "") // set, so the sizer must not touch it
	var fixed procSizer
	fixed.init()
	fixed.resize(6)
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("with GOMAXPROCS in the environment: %d Ps, want 2", got)
	}

	var p procSizer
	p.init()
	p.fixed = false // as without the variable
	for _, c := range []struct{ sessions, want int }{
		{0, 2}, {1, 2}, {2, 2}, {3, 3}, {6, 6}, {8, 8}, {64, 8}, {4, 4}, {0, 2},
	} {
		p.resize(c.sessions)
		if got := runtime.GOMAXPROCS(0); got != c.want {
			t.Fatalf("%d sessions: %d Ps, want %d", c.sessions, got, c.want)
		}
	}
}
