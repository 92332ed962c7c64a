package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/client"
)

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the daemon's tiers, sessions, namespaces and op counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.ctx(cmd.Context())
			defer cancel()
			c, err := g.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.Stats(ctx)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(stdout(cmd), st)
			}
			return printStatus(stdout(cmd), st)
		},
	}
}

func writeJSON(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(v)
}

func printStatus(w io.Writer, st *client.Stats) error {
	fmt.Fprintf(w, "kvtierd %s  pid %d  up %s\n", st.Version, st.PID, time.Duration(st.UptimeSeconds*float64(time.Second)).Round(time.Second))
	fmt.Fprintf(w, "socket    %s\nstate dir %s\n\n", st.Socket, st.StateDir)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TIER\tCAPACITY\tUSED\tUSED%\tBLOCKS\tRESERVED\tLEASED\tHITS\tMISSES\tHIT RATIO\tEVICTIONS\t")
	for _, t := range st.Tiers {
		name := t.Name
		if t.HugePages {
			name += " (huge)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t\n", name,
			humanize.IBytes(uint64(max(t.CapacityBytes, 0))), humanize.IBytes(uint64(max(t.UsedBytes, 0))),
			pct(float64(t.UsedBytes), float64(t.CapacityBytes)),
			t.Blocks, t.Reserved, t.Leased, t.Hits, t.Misses, ratio(t.HitRatio, t.Hits+t.Misses), t.Evictions)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nsessions  %d current, %d total, %d closed as hostile\n", st.Sessions, st.SessionsTotal, st.SessionsBad)
	if mp := st.MemoryPressure; mp != nil {
		fmt.Fprintf(w, "memory    host tier target %.0f%% (pressure %.1f%% from %s, psi some avg10 %.2f; %d shrinks, %d grows)\n",
			100*mp.TargetRatio, mp.Pressure, mp.Source, mp.SomeAvg10, mp.Shrinks, mp.Grows)
	}
	if len(st.EBPF) > 0 {
		var progs []string
		for _, p := range slices.Sorted(maps.Keys(st.EBPF)) {
			progs = append(progs, fmt.Sprintf("%s %s", p, map[bool]string{true: "on", false: "off (fallback)"}[st.EBPF[p]]))
		}
		fmt.Fprintf(w, "ebpf      %s\n", strings.Join(progs, ", "))
	}

	if len(st.Namespaces) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NS\tMODEL\tLAYOUT\tBLOCK\tSESSIONS")
		for _, n := range st.Namespaces {
			ns := n.Namespace
			layout := fmt.Sprintf("%dL x %dH x %dD %s, %d tok/blk, tp %d/%d",
				ns.Layers, ns.KVHeads, ns.HeadDim, ns.DType, ns.TokensPerBlock, ns.TPRank, ns.TPSize)
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\n", n.ID, ns.ModelID, layout, humanize.IBytes(ns.BlockBytes), n.Sessions)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if more := st.NamespacesTotal - len(st.Namespaces); more > 0 {
			fmt.Fprintf(w, "(%d more namespaces without sessions not listed)\n", more)
		}
	}

	if len(st.Ops) > 0 {
		names := make([]string, 0, len(st.Ops))
		for k := range st.Ops {
			names = append(names, k)
		}
		slices.Sort(names)
		parts := make([]string, len(names))
		for i, k := range names {
			parts[i] = fmt.Sprintf("%s=%d", k, st.Ops[k])
		}
		fmt.Fprintf(w, "\nops  %s\n", strings.Join(parts, "  "))
	}
	return nil
}

func pct(a, b float64) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*a/b)
}

// ratio prints "-" rather than a misleading 0% before any access.
func ratio(r float64, accesses uint64) string {
	if accesses == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*r)
}

func newEvictCmd(g *globals) *cobra.Command {
	var ns uint32
	var all bool
	cmd := &cobra.Command{
		Use:   "evict (--namespace ID | --all)",
		Short: "Drop the unleased blocks of one namespace, or of all, parked requests included",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nsSet := cmd.Flags().Changed("namespace")
			if nsSet == all {
				return errors.New("evict: give exactly one of --namespace ID or --all")
			}
			if nsSet && ns == 0 {
				return errors.New("evict: namespace ids start at 1 (see kvtierctl status)")
			}
			ctx, cancel := g.ctx(cmd.Context())
			defer cancel()
			c, err := g.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			n, err := c.Evict(ctx, ns, all)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(stdout(cmd), map[string]any{"evicted": n})
			}
			fmt.Fprintf(stdout(cmd), "evicted %d blocks\n", n)
			return nil
		},
	}
	cmd.Flags().Uint32Var(&ns, "namespace", 0, "namespace id (see kvtierctl status)")
	cmd.Flags().BoolVar(&all, "all", false, "evict every namespace")
	return cmd
}
