package tiers

import "fmt"

// watermarks are the mover's thresholds, fractions of the host tier's
// capacity. The chain is the one owner of the effective thresholds: the
// configured pair (SetWatermarks) scaled by two ratios, the host capacity
// target of a reload (SetCapacityRatio) and the memory pressure
// controller's target (SetPressureRatio):
//
//	effective = configured × capacityRatio × pressureRatio
//
// A snapshot is replaced as a whole and read as a whole, so a reader never
// sees a new high with an old low, nor one ratio's change undo another's.
type watermarks struct {
	high, low float64 // configured
	capRatio  float64 // host capacity target / arena size, (0, 1]
	pressure  float64 // memory pressure target, (0, 1]
}

func (w *watermarks) effective() (high, low float64) {
	r := w.capRatio * w.pressure
	return w.high * r, w.low * r
}

// Watermarks returns the mover's effective high and low watermarks: the
// configured ones scaled by the capacity and pressure ratios.
func (c *Chain) Watermarks() (high, low float64) {
	return c.wm.Load().effective()
}

// ConfiguredWatermarks returns the watermarks last set by the
// configuration (ChainConfig or SetWatermarks), before any scaling.
func (c *Chain) ConfiguredWatermarks() (high, low float64) {
	w := c.wm.Load()
	return w.high, w.low
}

// CapacityRatio returns the host capacity target as a share of the arena.
func (c *Chain) CapacityRatio() float64 { return c.wm.Load().capRatio }

// PressureRatio returns the memory pressure controller's target ratio.
func (c *Chain) PressureRatio() float64 { return c.wm.Load().pressure }

// update replaces the snapshot with f applied to a copy, then lets the
// demoter look at once (a lower threshold takes effect at the mover's next
// tick, ≤100 ms, or commit).
func (c *Chain) update(f func(w *watermarks)) {
	c.wmMu.Lock()
	w := *c.wm.Load()
	f(&w)
	c.wm.Store(&w)
	c.wmMu.Unlock()
	c.kickDemoter()
}

// SetWatermarks changes the configured thresholds on a running chain (a
// configuration reload). It requires 0 < low < high <= 1. The ratios in
// force keep scaling the new pair.
func (c *Chain) SetWatermarks(high, low float64) error {
	if !(high > 0 && high <= 1) || !(low > 0 && low < high) {
		return fmt.Errorf("tiers: watermarks must satisfy 0 < low < high <= 1, got high %v low %v", high, low)
	}
	c.update(func(w *watermarks) { w.high, w.low = high, low })
	return nil
}

// SetCapacityRatio sets the host tier's capacity target as a share r of
// its arena, 0 < r <= 1: the arena (a sealed memfd mapped by the clients)
// cannot shrink while running, so a smaller configured capacity scales the
// watermarks instead and the mover keeps the usage under the target.
func (c *Chain) SetCapacityRatio(r float64) error {
	if !(r > 0 && r <= 1) {
		return fmt.Errorf("tiers: capacity ratio must be in (0, 1], got %v", r)
	}
	c.update(func(w *watermarks) { w.capRatio = r })
	return nil
}

// SetPressureRatio sets the memory pressure controller's target ratio,
// 0 < r <= 1 (1: no pressure).
func (c *Chain) SetPressureRatio(r float64) error {
	if !(r > 0 && r <= 1) {
		return fmt.Errorf("tiers: pressure ratio must be in (0, 1], got %v", r)
	}
	c.update(func(w *watermarks) { w.pressure = r })
	return nil
}
