// Command ratelimit runs the real-time rate-limit measurements of package
// bench/ratelimit and prints min / median / max over the runs:
//
//	cd bench && go run ./ratelimit/cmd/ratelimit              # admitted rate at 3× for 10 s, 5 runs
//	go run ./ratelimit/cmd/ratelimit -runs 3 -dur 5s
//
// The decision's cost is a Go benchmark, side by side with the peers:
//
//	go test -run '^$' -bench . -count 5 ./ratelimit
//
// Run it on a quiet machine, without nice: every number is real time.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/grpc-resilience/resilience/bench/ratelimit"
)

func main() {
	d := ratelimit.DefaultAccuracy()
	runs := flag.Int("runs", 5, "runs of each measurement")
	dur := flag.Duration("dur", d.Duration, "duration of the admitted-rate run")
	rate := flag.Float64("rate", d.Rate, "the limit, calls per second")
	load := flag.Float64("load", d.Load, "offered load, a multiple of the rate")
	burst := flag.Int("burst", d.Burst, "the limit's burst")
	flag.Parse()
	d.Duration, d.Rate, d.Load, d.Burst = *dur, *rate, *load, *burst
	var ratios, xratios, gaps []float64
	for run := 1; run <= *runs; run++ {
		r, err := ratelimit.Accuracy(context.Background(), d)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ratelimit:", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "run %d: offered %d in %v, longest gap %v; admitted: ours %d (%.3f%% of the rate), x/time/rate %d (%.3f%%)\n",
			run, r.Offered, r.Elapsed.Round(time.Millisecond), r.MaxGap.Round(time.Microsecond), r.Admitted, 100*r.Ratio, r.XAdmitted, 100*r.XRatio)
		ratios = append(ratios, 100*r.Ratio)
		xratios = append(xratios, 100*r.XRatio)
		gaps = append(gaps, float64(r.MaxGap)/float64(time.Millisecond))
	}
	fmt.Printf("| admitted rate, %.0f× of %.0f/s (burst %d) for %v, %d runs | min | median | max |\n|---|---|---|---|\n",
		d.Load, d.Rate, d.Burst, d.Duration, *runs)
	row := func(name, unit string, v []float64) {
		slices.Sort(v)
		fmt.Printf("| %s | %.2f%s | %.2f%s | %.2f%s |\n", name, v[0], unit, v[len(v)/2], unit, v[len(v)-1], unit)
	}
	row("ours (internal/ratelimit)", "%", ratios)
	row("x/time/rate, same calls", "%", xratios)
	row("longest gap between calls", "ms", gaps)
}
