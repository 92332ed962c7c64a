// Command kvtierctl is the operator CLI of kvtierd: it shows the daemon's
// status (once, or live with top), evicts blocks, writes the host tier down
// to NVMe, plans KV-cache capacity, and benchmarks the daemon's data path
// against the machine's own memcpy bandwidth measured in the same run.
//
//	kvtierctl status [--json]
//	kvtierctl evict --namespace 3 | --all
//	kvtierctl flush
//	kvtierctl top [--interval 1s] [--once]
//	kvtierctl plan --model llama-3-8b | --hf-config config.json --concurrency 64 --avg-context 8192 ...
//	kvtierctl bench [--mode putget|mix|lookup|lookup-batch|nop] [--block-size 2MiB] ...
//
// It talks to the daemon only through the client library, like any engine
// would, so what bench reports is what an engine gets.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/shm"
)

func main() {
	// Ctrl-C stops a bench between ops, so it still deletes its blocks.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvtierctl: %v\n", err)
		os.Exit(1)
	}
}

// globals are the flags every subcommand shares.
type globals struct {
	socket  string
	json    bool
	timeout time.Duration
}

// newRootCmd builds a fresh command tree, so tests can run several commands
// in one process without flag state leaking between them.
func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "kvtierctl",
		Short: "Operate and benchmark kvtierd, the per-host KV-cache tiering daemon",
		// Errors are printed once by main; usage only helps for flag errors,
		// which cobra reports before RunE.
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.socket, "socket", shm.DefaultSocket(), "kvtierd control socket; $KVTIER_SOCKET sets the default")
	pf.BoolVar(&g.json, "json", false, "print machine-readable JSON")
	pf.DurationVar(&g.timeout, "timeout", 10*time.Second, "bound on each control call (connect, stats, evict); bench adds it to its run time")
	root.AddCommand(newStatusCmd(g), newEvictCmd(g), newBenchCmd(g), newReplayCmd(g),
		newPlanCmd(g), newTopCmd(g), newFlushCmd(g))
	return root
}

// dial connects to the daemon and turns "not running" into an actionable
// message.
func (g *globals) dial(ctx context.Context) (*client.Client, error) {
	opts := client.Options{Socket: g.socket, Name: "kvtierctl", DialTimeout: g.timeout}
	if g.socket == shm.DefaultSocket() {
		// The client checks a default socket's directory (another user
		// may have made it first); named, it would take it on trust.
		opts.Socket = ""
	}
	c, err := client.Dial(ctx, opts)
	if err != nil {
		var ref *client.RefusedError
		if errors.As(err, &ref) {
			return nil, fmt.Errorf("kvtierd at %s refused kvtierctl: %s", g.socket, ref.Message)
		}
		if errors.Is(err, shm.ErrSocketDirUnsafe) {
			// The client's advice names its Options; kvtierctl's are flags.
			// The default path is checked however it is named.
			return nil, fmt.Errorf("%w; for kvtierctl: $KVTIER_SOCKET, or --socket naming a path other than the default %s", err, g.socket)
		}
		return nil, fmt.Errorf("cannot reach kvtierd at %s (is it running? see --socket or $KVTIER_SOCKET): %w", g.socket, err)
	}
	return c, nil
}

// ctx returns a context bounded by --timeout.
func (g *globals) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	if g.timeout <= 0 {
		return context.WithCancel(parent)
	}
	return context.WithTimeout(parent, g.timeout)
}

func stdout(cmd *cobra.Command) io.Writer { return cmd.OutOrStdout() }
