// Package shm owns everything kvtier shares between processes: memfd-backed
// regions (the host arena and each session's ring region), the futex
// doorbells, the submission/completion rings and the wire format of both the
// control socket and the ring entries.
//
// It is the only package that knows byte layouts. The daemon and the client
// both import it; neither defines its own encoding.
//
// Trust: everything a peer can write is untrusted. Decoders copy a peer's
// bytes out of shared memory once, then validate the local copy; ring
// indices owned by the reading side are kept in private memory and only
// published to the shared header, never read back from it.
//
// Ownership: a Region owns one fd and one mapping; Close releases both. Ring
// values do not own their memory; the Region they were built on does.
package shm
