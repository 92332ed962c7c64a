//go:build race

package tiers

// raceEnabled scales the randomized tests down: the race detector makes the
// per-op invariant walk ~10x slower, and the concurrency test covers races.
const raceEnabled = true
