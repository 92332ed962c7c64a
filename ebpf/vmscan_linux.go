package ebpf

import (
	"errors"
	"os"
	"time"

	"github.com/cilium/ebpf/link"
)

// ReclaimStats counts direct-reclaim stalls since the probe was loaded.
type ReclaimStats struct {
	Stalls    uint64
	StallTime time.Duration
}

// ReclaimProbe counts direct-reclaim stalls (vmscan raw tracepoints).
type ReclaimProbe struct {
	objs       vmscanObjects
	begin, end link.Link
}

// OpenReclaimProbe loads and attaches the vmscan programs.
func OpenReclaimProbe(env Env) (*ReclaimProbe, error) {
	if err := env.prepare(); err != nil {
		return nil, err
	}
	p := &ReclaimProbe{}
	if err := loadVmscanObjects(&p.objs, nil); err != nil {
		return nil, classify("load vmscan programs", err)
	}
	var err error
	if p.begin, err = attach("mm_vmscan_direct_reclaim_begin", p.objs.HandleReclaimBegin); err != nil {
		p.objs.Close()
		return nil, err
	}
	if p.end, err = attach("mm_vmscan_direct_reclaim_end", p.objs.HandleReclaimEnd); err != nil {
		closeAll(p.begin, &p.objs)
		return nil, err
	}
	return p, nil
}

// Read returns the counters.
func (p *ReclaimProbe) Read() (ReclaimStats, error) {
	var s vmscanReclaimStats
	if err := p.objs.Reclaim.Lookup(uint32(0), &s); err != nil {
		return ReclaimStats{}, err
	}
	return ReclaimStats{Stalls: s.Stalls, StallTime: time.Duration(s.StallNs)}, nil
}

// Close detaches the programs and frees the maps.
func (p *ReclaimProbe) Close() error {
	err := closeAll(p.end, p.begin, &p.objs)
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}
