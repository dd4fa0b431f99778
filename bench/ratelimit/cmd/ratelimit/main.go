// Command ratelimit runs the real-time rate-limit measurements of package
// bench/ratelimit and prints min / median / max over the runs:
//
//	cd bench && go run ./ratelimit/cmd/ratelimit                     # both measurements, 3 runs
//	go run ./ratelimit/cmd/ratelimit -only accuracy -runs 5          # the admitted rate at 3× for 10 s
//	go run ./ratelimit/cmd/ratelimit -only distributed               # 4 processes sharing a limit in Redis
//	go run ./ratelimit/cmd/ratelimit -only distributed -fault redis-restart
//	go run ./ratelimit/cmd/ratelimit -only distributed -fault kill-replica
//	go run ./ratelimit/cmd/ratelimit -only grpc                      # gRPC server processes (server.New), real calls
//
// The decision's cost is a Go benchmark, side by side with the peers:
//
//	go test -run '^$' -bench . -count 5 ./ratelimit
//
// The distributed measurement needs redis-server on PATH. Run it on a
// quiet machine, without nice: every number is real time.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/grpc-resilience/resilience/bench/ratelimit"
)

func main() {
	if v := os.Getenv(ratelimit.ChildEnv); v != "" { // a replica process of the distributed measurement
		var args ratelimit.ChildArgs
		if err := json.Unmarshal([]byte(v), &args); err != nil {
			fmt.Fprintln(os.Stderr, "ratelimit child:", err)
			os.Exit(2)
		}
		if err := ratelimit.RunChild(args, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "ratelimit child:", err)
			os.Exit(1)
		}
		return
	}
	if v := os.Getenv(ratelimit.GRPCServerEnv); v != "" { // a server process of the gRPC measurement
		var args ratelimit.GRPCServerArgs
		if err := json.Unmarshal([]byte(v), &args); err != nil {
			fmt.Fprintln(os.Stderr, "ratelimit server:", err)
			os.Exit(2)
		}
		if err := ratelimit.RunGRPCServer(args, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "ratelimit server:", err)
			os.Exit(1)
		}
		return
	}
	d := ratelimit.DefaultAccuracy()
	runs := flag.Int("runs", 3, "runs of each measurement")
	only := flag.String("only", "", "accuracy, distributed or grpc (default accuracy and distributed)")
	dur := flag.Duration("dur", d.Duration, "duration of each run")
	rate := flag.Float64("rate", 0, "the limit, calls per second (default 1000)")
	load := flag.Float64("load", 0, "offered load, a multiple of the rate (default 3 for accuracy, 4 for distributed)")
	burst := flag.Int("burst", d.Burst, "the limit's burst")
	fault := flag.String("fault", "", "distributed: redis-restart (killed at 4 s, back at 6 s) or kill-replica (the busiest, at 4 s)")
	flag.Parse()
	if *only == "" || *only == "accuracy" {
		d.Duration, d.Burst = *dur, *burst
		if *rate > 0 {
			d.Rate = *rate
		}
		if *load > 0 {
			d.Load = *load
		}
		accuracy(d, *runs)
	}
	if *only == "grpc" {
		if err := grpcRate(*runs, *dur); err != nil {
			fmt.Fprintln(os.Stderr, "ratelimit:", err)
			os.Exit(1)
		}
	}
	if *only == "" || *only == "distributed" {
		c := ratelimit.DefaultDist()
		c.Duration, c.Burst, c.Fault = *dur, *burst, *fault
		if *rate > 0 {
			c.Rate = *rate
		}
		if *load > 0 {
			c.Load = *load
		}
		if err := distributed(c, *runs); err != nil {
			fmt.Fprintln(os.Stderr, "ratelimit:", err)
			os.Exit(1)
		}
	}
}

func accuracy(d ratelimit.AccuracyConfig, runs int) {
	var ratios, xratios, gaps []float64
	for run := 1; run <= runs; run++ {
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
	fmt.Printf("\n| admitted rate, %.0f× of %.0f/s (burst %d) for %v, %d runs | min | median | max |\n|---|---|---|---|\n",
		d.Load, d.Rate, d.Burst, d.Duration, runs)
	row("ours (internal/ratelimit)", "%", ratios)
	row("x/time/rate, same calls", "%", xratios)
	row("longest gap between calls", "ms", gaps)
}

func row(name, unit string, v []float64) {
	slices.Sort(v)
	fmt.Printf("| %s | %.2f%s | %.2f%s | %.2f%s |\n", name, v[0], unit, v[len(v)/2], unit, v[len(v)-1], unit)
}

func distributed(c ratelimit.DistConfig, runs int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	type agg struct{ worst, worstB, perRT, perRTA, p50, p99 []float64 }
	modes := []string{"leased", "envoy"}
	all := map[string]*agg{}
	for run := 1; run <= runs; run++ {
		for _, mode := range modes {
			c.Mode = mode
			r, err := ratelimit.Distributed(context.Background(), c, self)
			if err != nil {
				return fmt.Errorf("%s run %d: %w", mode, run, err)
			}
			a := all[mode]
			if a == nil {
				a = &agg{}
				all[mode] = a
			}
			worst, worstB := 0.0, 0.0
			for sec := 1; sec < len(r.A); sec++ {
				if c.Fault != "" && sec >= int(c.FaultAt/time.Second) && sec <= int((c.FaultAt+c.FaultFor)/time.Second) {
					continue // the fault's seconds are shown, not counted
				}
				wantB := c.Rate // tenant b is offered its limit, evenly over the replicas
				if c.Fault == "kill-replica" && sec > int(c.FaultAt/time.Second) {
					wantB = c.Rate * float64(c.Replicas-1) / float64(c.Replicas) // and one of them is gone
				}
				worst = max(worst, abs(float64(r.A[sec])/c.Rate-1))
				worstB = max(worstB, abs(float64(r.B[sec])/wantB-1))
			}
			perRT := float64(r.Admitted) / float64(max(r.RoundTrips, 1))
			perRTA := float64(r.AdmittedA) / float64(max(r.RoundTripsA, 1))
			a.perRTA = append(a.perRTA, perRTA)
			a.worst = append(a.worst, 100*worst)
			a.worstB = append(a.worstB, 100*worstB)
			a.perRT = append(a.perRT, perRT)
			a.p50 = append(a.p50, float64(r.P50)/float64(time.Microsecond))
			a.p99 = append(a.p99, float64(r.P99)/float64(time.Microsecond))
			fmt.Fprintf(os.Stderr, "%s run %d%s: tenant a per second %v; tenant b %v; %d admitted, %d round trips (%.1f admitted per round trip; tenant a %.1f); decision p50 %v p99 %v; %d by the fallback\n",
				mode, run, faultNote(c.Fault), r.A, r.B, r.Admitted, r.RoundTrips, perRT, perRTA, r.P50, r.P99, r.Fallback)
		}
	}
	fmt.Printf("\n| %d processes, %.0f/s per tenant, %.0f× load %s, %v, %d runs%s | min | median | max |\n|---|---|---|---|\n",
		c.Replicas, c.Rate, c.Load, shares(c.Shares), c.Duration, runs, faultNote(c.Fault))
	for _, mode := range modes {
		a := all[mode]
		row(mode+": tenant a, worst second's deviation from the rate (after the first)", "%", a.worst)
		row(mode+": tenant b (offered its limit), worst second's deviation from what it is offered", "%", a.worstB)
		row(mode+": tenant a's admitted calls per Redis round trip", "", a.perRTA)
		row(mode+": both tenants' admitted calls per Redis round trip", "", a.perRT)
		row(mode+": decision p50", "µs", a.p50)
		row(mode+": decision p99", "µs", a.p99)
	}
	return nil
}

func faultNote(f string) string {
	if f == "" {
		return ""
	}
	return ", fault " + f + " (its seconds not counted in the worst)"
}

func shares(s []float64) string {
	p := make([]string, len(s))
	for i, v := range s {
		p[i] = fmt.Sprintf("%.0f", 100*v)
	}
	return strings.Join(p, "/")
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// grpcRate runs the gRPC measurement: one server process with a local
// limit offered 3×, then 4 sharing one through Redis offered 4×, 70/10/10/10.
func grpcRate(runs int, dur time.Duration) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for _, c := range []ratelimit.GRPCConfig{ratelimit.DefaultGRPCLocal(), ratelimit.DefaultGRPCShared()} {
		c.Duration = dur
		var ratios, worst, offered []float64
		for run := 1; run <= runs; run++ {
			r, err := ratelimit.GRPC(context.Background(), c, self)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "grpc, %d server process(es), run %d: offered %d (%.0f/s), admitted %d (%.3f%% of burst + rate), refused %d, errors %d; per second %v\n",
				c.Replicas, run, r.Offered, r.OfferedRate, r.Admitted, 100*r.Ratio, r.Refused, r.Errors, r.PerSec)
			if r.Errors > 0 {
				return fmt.Errorf("grpc run %d: %d calls failed with neither OK nor RESOURCE_EXHAUSTED", run, r.Errors)
			}
			ratios = append(ratios, 100*r.Ratio)
			worst = append(worst, 100*r.WorstSecond)
			offered = append(offered, r.OfferedRate)
		}
		mode := "local limit, 1 server process"
		if c.Replicas > 1 {
			mode = fmt.Sprintf("limit shared in Redis, %d server processes %v", c.Replicas, c.Shares)
		}
		fmt.Printf("\n| over gRPC: %s, %.0f/s burst %d, offered %.0f× for %v, %d runs | min | median | max |\n|---|---|---|---|\n",
			mode, c.Rate, c.Burst, c.Load, c.Duration, runs)
		row("admitted, % of burst + rate × duration", "%", ratios)
		row("worst second after the first, off the rate by", "%", worst)
		row("offered, calls/s as sent", "", offered)
	}
	return nil
}
