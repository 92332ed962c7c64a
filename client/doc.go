// Package client is the Go client of kvtierd.
//
// A Client names a daemon (its control socket); a Session is one connection
// to it for one namespace (model + KV layout). Block bytes never cross the
// socket: a session maps the daemon's host arena and exchanges requests
// with it through a pair of shared-memory rings.
//
//	c, _ := client.Dial(ctx, client.Options{})
//	s, _ := c.Open(ctx, ns)
//	hashes := client.ChainHashes(client.Hash{}, tokens, int(ns.TokensPerBlock))
//	n, _ := s.Lookup(ctx, hashes)           // leading blocks already cached
//	_ = s.Put(ctx, hashes[n], block)         // copy in
//	_ = s.Get(ctx, hashes[0], dst)           // copy out
//
// Zero-copy: Reserve returns a slot to write into, then Commit; Acquire
// returns a leased slot to read from, then Release. A lease pins the block:
// the daemon neither evicts nor moves it until Release. Release does not
// wait for the daemon and rings no doorbell of its own: a polling ring loop
// takes it at once, a sleeping one with the session's next call or a timer
// within about 200 µs.
//
// Ownership: each Session runs two goroutines (completion reaper and socket
// watcher) that end with Close. After a daemon restart the session's calls
// in flight fail with ErrDisconnected and the next call reconnects; leases
// and reservations of the old connection are void (their Bytes stay mapped
// until released, so a stale reader never faults).
//
// Device API: with Options.Device the session copies blocks between the
// client's GPU memory and the daemon's tiers on the caller's CUDA stream
// (PutFromDeviceBatch, GetToDeviceBatch). The calls return once the copies
// are queued; a DeviceOp commits or releases at an event recorded after
// them, never synchronizing the device.
//
// Sessions are safe for concurrent use.
package client
