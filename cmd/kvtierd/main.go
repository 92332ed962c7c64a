// Command kvtierd is the per-host KV-cache tiering daemon. With no flags it
// runs on embedded defaults; see -h for overrides and the optional TOML
// config file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvtier/kvtier/daemon"
)

func main() {
	cfg, err := daemon.LoadFromArgs(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvtierd: invalid configuration:\n%v\n", err)
		os.Exit(2)
	}
	log := cfg.Log.NewLogger(os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d, err := daemon.New(cfg, log)
	if err != nil {
		log.Error("kvtierd failed to start", "err", err)
		os.Exit(1)
	}
	if err := d.Run(ctx); err != nil {
		log.Error("kvtierd stopped with error", "err", err)
		os.Exit(1)
	}
}
