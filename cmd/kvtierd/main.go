// Command kvtierd is the per-host KV-cache tiering daemon. With no flags it
// runs on embedded defaults; see -h for overrides and the optional TOML
// config file.
//
// Signals: SIGTERM and SIGINT drain and stop (bounded; see daemon.Run), or
// cut a start-up short (nothing is served);
// SIGHUP reads the configuration again (the -config file as it is now, the
// same flags) and applies what can change live (see daemon.Reload).
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
	// SIGHUP's default action kills the process: catch it before anything
	// slow (arena, NVMe reindex) so an early reload is queued, not fatal.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// SIGTERM and SIGINT likewise: one that comes during start-up (a
	// reindex of a large NVMe tier may take minutes) cuts it short.
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(term)

	cfg, err := daemon.LoadFromArgs(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvtierd: invalid configuration:\n%v\n", err)
		os.Exit(2)
	}
	log := cfg.Log.NewLogger(os.Stderr)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		select {
		case sig := <-term:
			stop() // before the line: whoever reads it may count on the stop
			log.Info("stop requested", "signal", sig.String())
		case <-ctx.Done():
		}
	}()
	d, err := daemon.NewContext(ctx, cfg, log)
	if err != nil && ctx.Err() != nil {
		log.Info("kvtierd stopped during start-up", "err", err)
		return
	}
	if err != nil {
		log.Error("kvtierd failed to start", "err", err)
		os.Exit(1)
	}
	reloads := make(chan struct{})
	go func() {
		defer close(reloads)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			log.Info("SIGHUP: reloading configuration")
			next, err := d.ReloadFromArgs(os.Args[1:])
			if err != nil {
				log.Error("configuration reload failed; keeping the running configuration", "err", err)
				continue
			}
			_ = d.Reload(next) // logs what it applied, ignored or refused
		}
	}()
	err = d.Run(ctx)
	stop()
	<-reloads
	if err != nil {
		log.Error("kvtierd stopped with error", "err", err)
		os.Exit(1)
	}
}
