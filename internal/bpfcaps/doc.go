// Package bpfcaps runs a test binary again as an unprivileged uid that
// holds only CAP_BPF and CAP_PERFMON, the privileges the systemd unit gives
// kvtierd (User=kvtier, AmbientCapabilities=CAP_BPF CAP_PERFMON). Tests use
// it to check that the eBPF probes load there, not just as root.
package bpfcaps
