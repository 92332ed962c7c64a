package client

import (
	"testing"
	"time"
)

func TestSpinBudget(t *testing.T) {
	for _, tt := range []struct {
		spin    time.Duration
		crowded bool
		want    time.Duration
	}{
		{50 * time.Microsecond, false, 50 * time.Microsecond},
		{50 * time.Microsecond, true, time.Millisecond},
		{200 * time.Microsecond, true, 4 * time.Millisecond},
		{-1, true, -20}, // a negative Spin (no polling) stays negative
	} {
		if got := spinBudget(tt.spin, tt.crowded); got != tt.want {
			t.Errorf("spinBudget(%v, %v) = %v, want %v", tt.spin, tt.crowded, got, tt.want)
		}
	}
}
