package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

// topFrame is one screen of kvtierctl top: the daemon's state at the second
// sample and its rates over the interval between the two. Rates are nil
// (JSON null, "-" on screen) when there is no earlier sample of the same
// daemon process.
type topFrame struct {
	Version       string    `json:"version"`
	PID           int       `json:"pid"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	At            time.Time `json:"at"`
	// IntervalSeconds is the time between the two samples.
	IntervalSeconds float64     `json:"interval_seconds"`
	Tiers           []topTier   `json:"tiers"`
	Moves           []topMove   `json:"moves"`
	Ops             []topOp     `json:"ops"`
	OpsPerSec       *float64    `json:"ops_per_sec"`
	Sessions        topSessions `json:"sessions"`
	ParkedBlocks    int         `json:"parked_blocks"`
}

type topTier struct {
	Name          string  `json:"name"`
	CapacityBytes int64   `json:"capacity_bytes"`
	UsedBytes     int64   `json:"used_bytes"`
	UsedShare     float64 `json:"used_share"`
	Blocks        int     `json:"blocks"`
	Leased        int     `json:"leased"`
	// Over the interval: accesses, hit ratio (nil without accesses),
	// hits, misses and evictions per second.
	Hits         uint64   `json:"hits"`
	Misses       uint64   `json:"misses"`
	HitRatio     *float64 `json:"hit_ratio"`
	HitsPerSec   *float64 `json:"hits_per_sec"`
	MissesPerSec *float64 `json:"misses_per_sec"`
	EvictPerSec  *float64 `json:"evictions_per_sec"`
	// Since the daemon started.
	HitRatioTotal float64 `json:"hit_ratio_total"`
	// accessesTotal (hits and misses since the start) tells a tier not
	// yet accessed ("-") from one that missed every access (0%).
	accessesTotal uint64
}

type topMove struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Over the interval; MeanCopySeconds is nil when nothing moved.
	Blocks          uint64   `json:"blocks"`
	BlocksPerSec    *float64 `json:"blocks_per_sec"`
	BytesPerSec     *float64 `json:"bytes_per_sec"`
	Errors          uint64   `json:"errors"`
	MeanCopySeconds *float64 `json:"mean_copy_seconds"`
	// Since the daemon started.
	BlocksTotal uint64 `json:"blocks_total"`
	BytesTotal  uint64 `json:"bytes_total"`
}

type topOp struct {
	Op         string   `json:"op"`
	PerSec     *float64 `json:"per_sec"`
	Count      uint64   `json:"count"` // over the interval
	CountTotal uint64   `json:"count_total"`
}

type topSessions struct {
	Current    int      `json:"current"`
	Total      uint64   `json:"total"`
	NewPerSec  *float64 `json:"new_per_sec"`
	Hostile    uint64   `json:"closed_hostile"`
	Namespaces int      `json:"namespaces"`
}

// delta is cur-prev for a counter, 0 if it went backwards.
func delta(cur, prev uint64) uint64 {
	if cur < prev {
		return 0
	}
	return cur - prev
}

// restartSlack is how far the start times (sample time − uptime) of two
// status samples of one daemon may seem to differ: the samples' round trips
// differ by far less, and a daemon restarted in between started later by at
// least the previous one's uptime.
const restartSlack = time.Second

// sameDaemon reports whether cur, sampled elapsed after prev, comes from the
// daemon process that produced prev. The pid alone does not tell: a daemon
// restarted as PID 1 of a container (or in the same process) keeps it, but
// its uptime starts again.
func sameDaemon(prev, cur *shm.Stats, elapsed time.Duration) bool {
	if prev.PID != cur.PID {
		return false
	}
	drift := elapsed.Seconds() - (cur.UptimeSeconds - prev.UptimeSeconds)
	return drift < restartSlack.Seconds()
}

func rate(n uint64, secs float64) *float64 {
	r := float64(n) / secs
	return &r
}

// computeTopFrame derives a frame from two snapshots taken dt apart. prev
// may be nil, or of another daemon process (after a restart): the frame
// then has no rates.
func computeTopFrame(prev, cur *shm.Stats, dt time.Duration, at time.Time) topFrame {
	f := topFrame{
		Version: cur.Version, PID: cur.PID, UptimeSeconds: cur.UptimeSeconds, At: at,
		ParkedBlocks: cur.ParkedBlocks,
		Sessions: topSessions{Current: cur.Sessions, Total: cur.SessionsTotal, Hostile: cur.SessionsBad,
			Namespaces: max(len(cur.Namespaces), cur.NamespacesTotal)},
	}
	secs := dt.Seconds()
	rates := prev != nil && secs > 0 && sameDaemon(prev, cur, dt)
	if !rates {
		prev = &shm.Stats{}
	} else {
		f.IntervalSeconds = secs
		f.Sessions.NewPerSec = rate(delta(cur.SessionsTotal, prev.SessionsTotal), secs)
	}

	prevTiers := map[string]shm.TierStats{}
	for _, t := range prev.Tiers {
		prevTiers[t.Name] = t
	}
	for _, t := range cur.Tiers {
		p := prevTiers[t.Name]
		tt := topTier{Name: t.Name, CapacityBytes: t.CapacityBytes, UsedBytes: t.UsedBytes,
			Blocks: t.Blocks, Leased: t.Leased, HitRatioTotal: t.HitRatio, accessesTotal: t.Hits + t.Misses}
		if t.CapacityBytes > 0 {
			tt.UsedShare = float64(t.UsedBytes) / float64(t.CapacityBytes)
		}
		if rates {
			tt.Hits, tt.Misses = delta(t.Hits, p.Hits), delta(t.Misses, p.Misses)
			tt.HitsPerSec, tt.MissesPerSec = rate(tt.Hits, secs), rate(tt.Misses, secs)
			tt.EvictPerSec = rate(delta(t.Evictions, p.Evictions), secs)
			if n := tt.Hits + tt.Misses; n > 0 {
				r := float64(tt.Hits) / float64(n)
				tt.HitRatio = &r
			}
		}
		f.Tiers = append(f.Tiers, tt)
	}

	prevMoves := map[[2]string]shm.MoveStats{}
	for _, m := range prev.Moves {
		prevMoves[[2]string{m.From, m.To}] = m
	}
	for _, m := range cur.Moves {
		p := prevMoves[[2]string{m.From, m.To}]
		tm := topMove{From: m.From, To: m.To, BlocksTotal: m.Blocks, BytesTotal: m.Bytes}
		if rates {
			tm.Blocks = delta(m.Blocks, p.Blocks)
			tm.Errors = delta(m.Errors, p.Errors)
			tm.BlocksPerSec = rate(tm.Blocks, secs)
			tm.BytesPerSec = rate(delta(m.Bytes, p.Bytes), secs)
			if tm.Blocks > 0 && m.Seconds >= p.Seconds {
				mean := (m.Seconds - p.Seconds) / float64(tm.Blocks)
				tm.MeanCopySeconds = &mean
			}
		}
		f.Moves = append(f.Moves, tm)
	}

	names := make([]string, 0, len(cur.Ops))
	for k := range cur.Ops {
		names = append(names, k)
	}
	slices.Sort(names)
	var total uint64
	for _, k := range names {
		o := topOp{Op: k, CountTotal: cur.Ops[k]}
		if rates {
			o.Count = delta(cur.Ops[k], prev.Ops[k])
			o.PerSec = rate(o.Count, secs)
			total += o.Count
		}
		f.Ops = append(f.Ops, o)
	}
	if rates {
		f.OpsPerSec = rate(total, secs)
	}
	return f
}

// renderTopFrame draws a frame as text, without any terminal control.
func renderTopFrame(w io.Writer, f topFrame) error {
	iv := "no earlier sample"
	if f.IntervalSeconds > 0 {
		iv = fmt.Sprintf("rates over %s", time.Duration(f.IntervalSeconds*float64(time.Second)).Round(time.Millisecond))
	}
	fmt.Fprintf(w, "kvtierd %s  pid %d  up %s  %s  %s\n\n", f.Version, f.PID,
		time.Duration(f.UptimeSeconds*float64(time.Second)).Round(time.Second), f.At.Format("15:04:05"), iv)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TIER\tCAPACITY\tUSED\tUSED%\tBLOCKS\tLEASED\tHITS/s\tMISSES/s\tHIT%\tHIT% ALL\tEVICT/s\t")
	for _, t := range f.Tiers {
		hr := "-"
		if t.HitRatio != nil {
			hr = fmt.Sprintf("%.1f%%", 100**t.HitRatio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", t.Name,
			humanize.IBytes(uint64(max(t.CapacityBytes, 0))), humanize.IBytes(uint64(max(t.UsedBytes, 0))),
			pct(float64(t.UsedBytes), float64(t.CapacityBytes)), t.Blocks, t.Leased,
			perSec(t.HitsPerSec), perSec(t.MissesPerSec), hr, ratio(t.HitRatioTotal, t.accessesTotal), perSec(t.EvictPerSec))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(f.Moves) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "MOVE\tBLOCKS/s\tBYTES/s\tERRORS\tMEAN COPY\tBLOCKS ALL\tBYTES ALL\t")
		for _, m := range f.Moves {
			bps := "-"
			if m.BytesPerSec != nil {
				bps = humanize.IBytes(uint64(*m.BytesPerSec)) + "/s"
			}
			mc := "-"
			if m.MeanCopySeconds != nil {
				mc = time.Duration(*m.MeanCopySeconds * float64(time.Second)).Round(time.Microsecond).String()
			}
			fmt.Fprintf(tw, "%s → %s\t%s\t%s\t%d\t%s\t%d\t%s\t\n", m.From, m.To, perSec(m.BlocksPerSec), bps,
				m.Errors, mc, m.BlocksTotal, humanize.IBytes(m.BytesTotal))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(f.Ops) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "OP\tOPS/s\tALL\t")
		for _, o := range f.Ops {
			fmt.Fprintf(tw, "%s\t%s\t%d\t\n", o.Op, perSec(o.PerSec), o.CountTotal)
		}
		fmt.Fprintf(tw, "total\t%s\t\t\n", perSec(f.OpsPerSec))
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	s := f.Sessions
	fmt.Fprintf(w, "\nsessions %d current, %d total (%s new/s), %d closed as hostile, %d namespaces\nparked blocks %d\n",
		s.Current, s.Total, perSec(s.NewPerSec), s.Hostile, s.Namespaces, f.ParkedBlocks)
	return nil
}

func perSec(r *float64) string {
	switch {
	case r == nil:
		return "-"
	case *r >= 100:
		return fmt.Sprintf("%.0f", *r)
	default:
		return fmt.Sprintf("%.1f", *r)
	}
}

// ANSI: cursor home, clear screen.
const clearScreen = "\x1b[H\x1b[2J"

func newTopCmd(g *globals) *cobra.Command {
	var (
		interval time.Duration
		once     bool
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Live view of tiers, hit rates, movement between tiers and op rates",
		Long: `top samples the daemon's status every --interval and redraws a screen of
tiers (capacity, use, hit rates over the interval), movement between tiers
(blocks/s, bytes/s, mean copy time), ops/s per op, sessions and parked blocks.
Rates are the difference of two samples over the time between them.

--once prints a single frame from two samples --interval apart and exits. With
--json each frame is one JSON object per line. Stop it with Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return errors.New("top: --interval must be positive")
			}
			ctx := cmd.Context()
			dctx, cancel := g.ctx(ctx)
			c, err := g.dial(dctx)
			cancel()
			if err != nil {
				return err
			}
			defer c.Close()
			w := stdout(cmd)
			fancy := false
			if f, ok := w.(*os.File); ok && !g.json && !once && term.IsTerminal(int(f.Fd())) {
				fancy = true
			}
			return runTop(ctx, g, c, w, cmd.ErrOrStderr(), interval, once, fancy)
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between samples")
	cmd.Flags().BoolVar(&once, "once", false, "print one frame from two samples --interval apart, then exit")
	return cmd
}

func runTop(ctx context.Context, g *globals, c *client.Client, w, errw io.Writer, interval time.Duration, once, fancy bool) error {
	sample := func() (*shm.Stats, time.Time, error) {
		sctx, cancel := g.ctx(ctx)
		defer cancel()
		st, err := c.Stats(sctx)
		return st, time.Now(), err
	}
	prev, prevAt, err := sample()
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if fancy {
		// Show the state at once; rates follow with the next sample.
		buf.WriteString(clearScreen)
		if err := renderTopFrame(&buf, computeTopFrame(nil, prev, 0, prevAt)); err != nil {
			return err
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if once {
				return ctx.Err()
			}
			return nil
		case <-t.C:
		}
		cur, at, err := sample()
		buf.Reset()
		if fancy {
			buf.WriteString(clearScreen)
		}
		switch {
		case err != nil && once:
			return err
		case err != nil && ctx.Err() != nil:
			return nil // Ctrl-C during the sample
		case err != nil:
			// Keep watching: the daemon may be restarting. --json keeps
			// stdout to one frame object per line: the error goes to stderr.
			if g.json {
				fmt.Fprintf(errw, "%s  %v\n", at.Format("15:04:05"), err)
			} else {
				fmt.Fprintf(&buf, "%s  %v\n", at.Format("15:04:05"), err)
			}
			prev = nil
		default:
			f := computeTopFrame(prev, cur, at.Sub(prevAt), at)
			switch {
			case g.json && once:
				err = writeJSON(&buf, f)
			case g.json:
				err = json.NewEncoder(&buf).Encode(f) // one object per line
			default:
				err = renderTopFrame(&buf, f)
				if !fancy && !once {
					buf.WriteString("\n")
				}
			}
			if err != nil {
				return err
			}
			prev, prevAt = cur, at
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		if once {
			return nil
		}
	}
}
