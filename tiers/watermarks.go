package tiers

import "fmt"

// watermarks are the mover's thresholds, fractions of the host tier's
// capacity. They are replaced as a pair (SetWatermarks) and read as a pair,
// so a reader never sees a new high with an old low.
type watermarks struct{ high, low float64 }

// Watermarks returns the mover's current high and low watermarks.
func (c *Chain) Watermarks() (high, low float64) {
	w := c.wm.Load()
	return w.high, w.low
}

// SetWatermarks changes the mover's thresholds on a running chain (a
// configuration reload). It requires 0 < low < high <= 1. A lower high
// watermark takes effect at the mover's next tick (≤100 ms) or commit.
func (c *Chain) SetWatermarks(high, low float64) error {
	if !(high > 0 && high <= 1) || !(low > 0 && low < high) {
		return fmt.Errorf("tiers: watermarks must satisfy 0 < low < high <= 1, got high %v low %v", high, low)
	}
	c.wm.Store(&watermarks{high: high, low: low})
	c.kickDemoter()
	return nil
}
