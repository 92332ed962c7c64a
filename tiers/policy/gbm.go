package policy

// gbm is a small gradient-boosted regression tree ensemble (squared loss)
// over features pre-quantized to byte bins, the model of LRB. It is the
// histogram algorithm of LightGBM reduced to what a replacement policy
// needs: every feature is already a small integer (a log-scale bin), so a
// split is "bin ≤ threshold" and one pass over the samples per tree level
// builds every histogram of that level.
type gbm struct {
	base  float32
	trees [][]gNode
}

// gNode is a tree node: an inner node when left > 0 (children at left and
// left+1), a leaf with value val otherwise.
type gNode struct {
	feat uint8
	thr  uint8
	left int32
	val  float32
}

// gbmParams are LightGBM's defaults where they apply (learning rate 0.1,
// min_data_in_leaf 20, up to 32 leaves) and LRB's 32 boosting rounds.
type gbmParams struct {
	trees   int
	depth   int // 2^depth leaves at most
	rate    float32
	minLeaf int
}

var gbmDefault = gbmParams{trees: 32, depth: 5, rate: 0.1, minLeaf: 20}

func (g *gbm) predict(x *[lFeat]uint8) float32 {
	s := g.base
	for _, t := range g.trees {
		i := int32(0)
		for t[i].left > 0 {
			if x[t[i].feat] <= t[i].thr {
				i = t[i].left
			} else {
				i = t[i].left + 1
			}
		}
		s += t[i].val
	}
	return s
}

// gbmScratch holds the buffers of fitGBM between trainings.
type gbmScratch struct {
	pred  []float32
	res   []float32
	node  []int32
	hs    []float64 // histogram sums: [slot][feat][bin]
	hn    []int32   // histogram counts
	nodeS []int32   // node → slot in the level's histograms, -1 if not split
	lsum  []float64 // per node: residual sum of the last level's leaves
	lnum  []int32
}

// fitGBM trains a model on x, y. It returns nil when there are too few
// samples to split even once.
func fitGBM(x [][lFeat]uint8, y []float32, prm gbmParams, sc *gbmScratch) *gbm {
	n := len(x)
	if n < 2*prm.minLeaf {
		return nil
	}
	var maxBin [lFeat]int
	for i := range x {
		for f, v := range x[i] {
			maxBin[f] = max(maxBin[f], int(v))
		}
	}
	mean := 0.0
	for _, v := range y {
		mean += float64(v)
	}
	mean /= float64(n)
	g := &gbm{base: float32(mean)}
	sc.pred = grow(sc.pred, n)
	sc.res = grow(sc.res, n)
	sc.node = grow(sc.node, n)
	for i := range sc.pred {
		sc.pred[i] = g.base
	}
	slots := 1 << (prm.depth - 1)
	sc.hs = grow(sc.hs, slots*lFeat*256)
	sc.hn = grow(sc.hn, slots*lFeat*256)
	sc.nodeS = grow(sc.nodeS, 1<<(prm.depth+1))
	for range prm.trees {
		for i := range n {
			sc.res[i] = y[i] - sc.pred[i]
			sc.node[i] = 0
		}
		t := []gNode{{}}
		level := []int32{0}
		for d := 0; d < prm.depth && len(level) > 0; d++ {
			for i := range sc.nodeS {
				sc.nodeS[i] = -1
			}
			for s, nd := range level {
				sc.nodeS[nd] = int32(s)
			}
			clear(sc.hs[:len(level)*lFeat*256])
			clear(sc.hn[:len(level)*lFeat*256])
			for i := range n {
				s := sc.nodeS[sc.node[i]]
				if s < 0 {
					continue
				}
				base := int(s) * lFeat * 256
				r := float64(sc.res[i])
				for f, v := range x[i] {
					j := base + f*256 + int(v)
					sc.hs[j] += r
					sc.hn[j]++
				}
			}
			var next []int32
			for s, nd := range level {
				base := s * lFeat * 256
				// totals from feature 0
				tot, cnt := 0.0, 0
				for b := 0; b <= maxBin[0]; b++ {
					tot += sc.hs[base+b]
					cnt += int(sc.hn[base+b])
				}
				bestGain, bestF, bestT := 1e-9, -1, 0
				if cnt >= 2*prm.minLeaf {
					parent := tot * tot / float64(cnt)
					for f := range lFeat {
						sl, nl := 0.0, 0
						h := base + f*256
						for b := 0; b < maxBin[f]; b++ {
							sl += sc.hs[h+b]
							nl += int(sc.hn[h+b])
							if nl < prm.minLeaf {
								continue
							}
							nr := cnt - nl
							if nr < prm.minLeaf {
								break
							}
							sr := tot - sl
							gain := sl*sl/float64(nl) + sr*sr/float64(nr) - parent
							if gain > bestGain {
								bestGain, bestF, bestT = gain, f, b
							}
						}
					}
				}
				if bestF < 0 {
					t[nd].val = prm.rate * float32(tot/float64(max(cnt, 1)))
					continue
				}
				l := int32(len(t))
				t = append(t, gNode{}, gNode{})
				t[nd] = gNode{feat: uint8(bestF), thr: uint8(bestT), left: l}
				next = append(next, l, l+1)
			}
			if len(next) == 0 {
				level = nil
				break
			}
			for i := range n {
				nd := sc.node[i]
				if s := sc.nodeS[nd]; s >= 0 && t[nd].left > 0 {
					if x[i][t[nd].feat] <= t[nd].thr {
						sc.node[i] = t[nd].left
					} else {
						sc.node[i] = t[nd].left + 1
					}
				}
			}
			level = next
		}
		// leaves of the last level: mean residual
		if len(level) > 0 {
			sc.lsum = grow(sc.lsum, len(t))
			sc.lnum = grow(sc.lnum, len(t))
			clear(sc.lsum)
			clear(sc.lnum)
			for i := range n {
				if nd := sc.node[i]; t[nd].left == 0 {
					sc.lsum[nd] += float64(sc.res[i])
					sc.lnum[nd]++
				}
			}
			for _, nd := range level {
				if sc.lnum[nd] > 0 {
					t[nd].val = prm.rate * float32(sc.lsum[nd]/float64(sc.lnum[nd]))
				}
			}
		}
		for i := range n {
			sc.pred[i] += t[sc.node[i]].val
		}
		g.trees = append(g.trees, t)
	}
	return g
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
