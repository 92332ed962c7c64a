package policy

// A policy is built with a capacity in blocks, but a tier sized in bytes
// cannot know its size in blocks before clients have stored them (the
// daemon's hint assumes 1 MiB blocks; KV blocks range from about 0.5 to
// 64 MiB). The size-dependent policies (Density, ARC, S3-FIFO, LRU-2) size
// themselves to the tier instead: to the blocks resident when the tier asks
// for a victim (it is full), and, while the tier is still filling, to at
// least twice their size once a quarter more blocks than that are
// resident. With a hint 8× too small, ARC, LRU-2 and S3-FIFO lost up to
// 0.04–0.06 of hit ratio to LRU on the development trace (docs/policy.md,
// "Capacity").

// resized reports whether n resident blocks call for a new size in place of
// cur: outside a band of ±25%, so that a demotion pass from the high
// watermark to the low one (10% by default) does not move it.
func resized(cur, n int) bool {
	return n > 0 && (4*n >= 5*cur || 5*n <= 4*cur)
}

// grown returns the size a policy that has not been asked for a victim yet
// (its tier is still filling) takes when n blocks are resident with size
// cur: at least twice cur once n is a quarter past it, cur otherwise (a tier
// that inserts before it evicts holds cur+1 blocks at its first victim).
func grown(cur, n int) int {
	if 4*n >= 5*cur {
		return max(n, 2*cur)
	}
	return cur
}
