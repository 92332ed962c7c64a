// Package memcopy holds the block copy routines the client library uses for
// its copying calls, so that the data path and the benchmarks' memcpy
// baseline copy the same way.
package memcopy

// chunk stays below the 1 MiB at which Go's runtime memmove (amd64) turns to
// non-temporal stores, and within a typical L2.
const chunk = 256 << 10

// ToHot copies src into dst (like copy) with ordinary, cache-allocating
// stores, and returns the number of bytes copied. It copies forward, piece
// by piece, so overlapping slices come out as copy's would only when dst
// does not start after src.
//
// Go's copy writes any move of 1 MiB or more with non-temporal stores that
// bypass the cache, which suits a destination nobody reads soon (an arena
// slot) but not a caller's buffer: that is usually reused from call to call
// (so its lines are already cached) and read right after the copy (by the
// engine, or a DMA to the GPU). glibc's memcpy keeps such copies cacheable
// up to about three quarters of the last-level cache. Copying in pieces
// below the runtime's threshold gets the same effect in pure Go.
func ToHot(dst, src []byte) int {
	n := min(len(dst), len(src))
	for off := 0; off < n; off += chunk {
		end := min(off+chunk, n)
		copy(dst[off:end], src[off:end])
	}
	return n
}
