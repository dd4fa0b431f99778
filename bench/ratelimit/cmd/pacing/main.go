// Command pacing runs the client pacing measurement of package
// bench/ratelimit (RunPacing) in real time over loopback, each client in
// turn within each run, and prints every run and the min / median / max of
// the server's refused attempts per pushback period:
//
//	cd bench && go run ./ratelimit/cmd/pacing -runs 3
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"

	"github.com/grpc-resilience/resilience/bench/ratelimit"
)

func main() {
	runs := flag.Int("runs", 3, "runs of each client")
	cfg := ratelimit.DefaultPacing()
	flag.DurationVar(&cfg.Duration, "dur", cfg.Duration, "duration of each run")
	flag.Parse()
	fmt.Printf("server: one call per %v, refusals with RetryInfo; %d callers every %v, %v per run; retry 3 attempts on RESOURCE_EXHAUSTED\n",
		cfg.Period, cfg.Callers, cfg.Think, cfg.Duration)
	per := make([][]float64, len(ratelimit.PacingClients))
	for run := range *runs {
		for i := range ratelimit.PacingClients {
			r, err := ratelimit.RunPacing(context.Background(), cfg, i)
			if err != nil {
				fmt.Fprintln(os.Stderr, "pacing:", err)
				os.Exit(1)
			}
			fmt.Printf("run %d  %v\n", run+1, r)
			per[i] = append(per[i], r.DoomedPerPeriod())
		}
	}
	for i, c := range ratelimit.PacingClients {
		v := slices.Clone(per[i])
		slices.Sort(v)
		fmt.Printf("%-22s refused per pushback period: min %.2f  median %.2f  max %.2f\n", c.Name, v[0], v[len(v)/2], v[len(v)-1])
	}
}
