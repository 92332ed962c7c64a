//go:build !race

package tiers

const raceEnabled = false
