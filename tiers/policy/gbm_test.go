package policy

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestGBMFits checks the tree ensemble learns a step and an additive
// function of two features, and ignores a noise feature.
func TestGBMFits(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var x [][lFeat]uint8
	var y []float32
	f := func(v *[lFeat]uint8) float32 {
		s := float32(0)
		if v[3] > 40 {
			s += 4
		}
		return s + float32(v[7])/20
	}
	for range 5000 {
		var v [lFeat]uint8
		for j := range v {
			v[j] = uint8(r.IntN(80))
		}
		x = append(x, v)
		y = append(y, f(&v)+float32(r.NormFloat64()*0.1))
	}
	var sc gbmScratch
	g := fitGBM(x, y, gbmDefault, &sc)
	if g == nil {
		t.Fatal("no model")
	}
	se := 0.0
	for range 1000 {
		var v [lFeat]uint8
		for j := range v {
			v[j] = uint8(r.IntN(80))
		}
		d := float64(g.predict(&v) - f(&v))
		se += d * d
	}
	// 32 rounds at rate 0.1 leave (0.9)^32 ≈ 3% of the signal unfitted.
	if rmse := math.Sqrt(se / 1000); rmse > 0.4 {
		t.Fatalf("rmse %.3f", rmse)
	}
	if fitGBM(x[:10], y[:10], gbmDefault, &sc) != nil {
		t.Fatal("fitted 10 samples")
	}
}
