package main

import (
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// startBar draws a bar of total units on stderr when it is a terminal and
// output is for humans, calling update every 100 ms to move it; counted
// bars show the count and an ETA, timed ones only the elapsed time. The
// returned func stops the refresher and clears the bar.
func startBar(cmd *cobra.Command, g *globals, total int64, desc string, counted bool, update func(*progressbar.ProgressBar)) func() {
	f, ok := cmd.ErrOrStderr().(*os.File)
	if g.json || !ok || !term.IsTerminal(int(f.Fd())) {
		return func() {}
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(f),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(counted),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionClearOnFinish(),
	}
	if counted {
		opts = append(opts, progressbar.OptionShowCount())
	}
	bar := progressbar.NewOptions64(total, opts...)
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				update(bar)
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped
		bar.Finish()
	}
}
