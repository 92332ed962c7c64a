package policy

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func envList(name, def string) []float64 {
	s := os.Getenv(name)
	if s == "" {
		s = def
	}
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, _ := strconv.ParseFloat(f, 64)
		out = append(out, v)
	}
	return out
}

// TestLRBExp is a scratch experiment: LRBEXP=1 go test -run LRBExp -v
func TestLRBExp(t *testing.T) {
	if os.Getenv("LRBEXP") == "" {
		t.Skip()
	}
	w := Compile(devTrace(t))
	for _, nf := range envList("SIZES", "2000,10000") {
		n := int(nf)
		lru := w.Simulate(n, NewLRU()).HitRatio()
		bel := w.Simulate(n, NewBelady(w, n)).HitRatio()
		for _, wm := range envList("WIN", "8") {
			for _, tm := range envList("TRAIN", "8") {
				for _, dl := range envList("DELAY", "0") {
					for _, fr := range envList("FROMRES", "0") {
						for _, pr := range envList("PROTECT", "0") {
							t0 := time.Now()
							p := NewLRB(n)
							p.win = uint64(wm * float64(n))
							p.trN = max(int(tm*float64(n)), 1024)
							p.delay = dl != 0
							p.fromRes = fr != 0
							p.protect = pr != 0
							got := w.Simulate(n, p).HitRatio()
							fmt.Printf("N=%d win=%g train=%g delay=%g fromres=%g protect=%g: LRU %.4f lrb %.4f (%.1f%%) Belady %.4f  [%v, %d fits]\n", n, wm, tm, dl, fr, pr, lru, got, 100*gapFrac(got, lru, bel), bel, time.Since(t0).Round(time.Millisecond), p.ver)
						}
					}
				}
			}
		}
	}
}

// victimProbe wraps a policy and records log2 of the true distance to the
// next reference of each victim (noNext → 2^20).
type victimProbe struct {
	Policy
	w    *Workload
	cur  int
	pos  map[Key][]int32
	sum  float64
	dead int
	n    int
}

func newProbe(w *Workload, p Policy) *victimProbe {
	v := &victimProbe{Policy: p, w: w, pos: map[Key][]int32{}}
	for i, k := range w.keys {
		v.pos[k] = append(v.pos[k], int32(i))
	}
	return v
}
func (v *victimProbe) Access(k Key, a AccessInfo) { v.cur++; v.Policy.Access(k, a) }
func (v *victimProbe) Admit(k Key, a AccessInfo) bool {
	v.cur++
	return v.Policy.Admit(k, a)
}
func (v *victimProbe) Victim() (Key, bool) {
	k, ok := v.Policy.Victim()
	if ok {
		ps := v.pos[k]
		d := 1 << 20
		for _, q := range ps {
			if int(q) >= v.cur {
				d = int(q) - v.cur + 1
				break
			}
		}
		if d == 1<<20 {
			v.dead++
		}
		v.sum += math.Log2(float64(d))
		v.n++
	}
	return k, ok
}

func TestLRBProbe(t *testing.T) {
	if os.Getenv("LRBEXP") == "" {
		t.Skip()
	}
	w := Compile(devTrace(t))
	for _, nf := range envList("SIZES", "2000,10000") {
		n := int(nf)
		for _, name := range []string{"chain", "density", "lrb"} {
			p, _ := New(name, n)
			v := newProbe(w, p)
			h := w.Simulate(n, v).HitRatio()
			fmt.Printf("N=%d %s: hit %.4f victims %d, mean log2 next-use %.2f, dead %.1f%%\n", n, name, h, v.n, v.sum/float64(v.n), 100*float64(v.dead)/float64(v.n))
		}
	}
}
