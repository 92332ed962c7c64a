package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

// flushTimeout is flush's default bound: writing a large host tier down
// takes longer than a control call (the daemon stops on its own after 60s).
const flushTimeout = 2 * time.Minute

type flushResult struct {
	Blocks  int     `json:"blocks"`
	Seconds float64 `json:"seconds"`
}

func newFlushCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "flush",
		Short: "Write the host tier down to NVMe (host copies stay resident)",
		Long: `flush writes every host-tier block that has no copy in NVMe yet down to the
NVMe tier, as the daemon does on shutdown with flush_on_stop, and prints how
many blocks it wrote. The host tier keeps its copies, so a second flush writes
nothing. Blocks held only on a GPU are not written (at shutdown the daemon
first copies them into the host tier; a flush here would push hot host blocks
out to make room for them). Without --timeout, flush waits up to ` + flushTimeout.String() + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lg := *g
			if !cmd.Flags().Changed("timeout") {
				lg.timeout = flushTimeout
			}
			ctx, cancel := lg.ctx(cmd.Context())
			defer cancel()
			c, err := lg.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.Stats(ctx)
			if err != nil {
				return err
			}
			hasNVMe := false
			for _, t := range st.Tiers {
				hasNVMe = hasNVMe || t.Name == "nvme"
			}
			if !hasNVMe {
				return errors.New("flush: kvtierd runs without an NVMe tier; there is nowhere to write the host tier")
			}
			t0 := time.Now()
			n, err := c.Flush(ctx)
			res := flushResult{Blocks: n, Seconds: time.Since(t0).Seconds()}
			if err != nil {
				return err // it names the blocks written before the daemon stopped
			}
			if g.json {
				return writeJSON(stdout(cmd), res)
			}
			fmt.Fprintf(stdout(cmd), "flushed %d blocks to nvme in %s\n", n, time.Duration(res.Seconds*float64(time.Second)).Round(time.Millisecond))
			return nil
		},
	}
}
