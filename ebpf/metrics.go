package ebpf

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

// HistogramReader is what IOCollector scrapes (*IOLatency, or a fake).
type HistogramReader interface {
	Read(op int) (Histogram, error)
}

// Bucket bounds of the exported histogram: the log2 slots below
// minSlot fold into the first bucket (≤ 1.024 µs), those above maxSlot into
// +Inf (> ~68.7 s).
const (
	minSlot = 9
	maxSlot = 35
)

// IOCollector exports an IOLatency's histograms as
// kvtier_nvme_io_latency_seconds{op} (const histograms with cumulative
// buckets, built from the kernel's map at scrape time).
type IOCollector struct {
	desc *prometheus.Desc
	src  func() HistogramReader
}

// NewIOCollector returns a collector of what src returns at scrape time
// (nil: the probe is off, nothing is exported).
func NewIOCollector(namespace string, src func() HistogramReader) *IOCollector {
	return &IOCollector{src: src, desc: prometheus.NewDesc(prometheus.BuildFQName(namespace, "nvme", "io_latency_seconds"),
		"Latency of block requests (issue to completion) on the disk that backs the NVMe tier, measured in the kernel (eBPF block_rq tracepoints).",
		[]string{"op"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *IOCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *IOCollector) Collect(ch chan<- prometheus.Metric) {
	src := c.src()
	if src == nil {
		return
	}
	for op, name := range OpNames {
		h, err := src.Read(op)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.desc, err)
			continue
		}
		count, sum, buckets := h.Cumulative()
		ch <- prometheus.MustNewConstHistogram(c.desc, count, sum, buckets, name)
	}
}

// Cumulative converts the log2 slots into Prometheus buckets: upper bound
// in seconds → count of observations at or below it. Slot i's values lie
// in [2^i, 2^(i+1)) ns, so they count in the bucket bounded by 2^(i+1) ns.
func (h Histogram) Cumulative() (count uint64, sumSeconds float64, buckets map[float64]uint64) {
	buckets = make(map[float64]uint64, maxSlot-minSlot+1)
	var acc uint64
	for i := 0; i < nSlots; i++ {
		acc += h.Slots[i]
		if i >= minSlot && i <= maxSlot {
			buckets[math.Ldexp(1, i+1)*1e-9] = acc
		}
	}
	// The count is the slots' total: the count field is bumped separately
	// and may run one ahead of them during a scrape.
	return acc, float64(h.SumNs) * 1e-9, buckets
}
