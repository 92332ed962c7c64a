// Package daemon is kvtierd: the control socket server, sessions and their
// ring loops, op dispatch onto the tiers, configuration and lifecycle.
//
// Ownership: Daemon owns the listener, the host arena region, the tier and
// every session; Run returns only after all session goroutines have exited.
// Each session owns two goroutines: the ring loop (the only code touching
// the session's reservation and lease tables) and the control reader (which
// notices the peer's death by EOF and stops the ring loop). Everything a
// session reads from its socket or its ring region is untrusted: a peer
// that breaks the protocol gets its session closed with a logged reason.
package daemon
