// Command overload runs the real-time overload suite of package
// bench/overload and prints its tables (median, min and max over the runs)
// with the targets of issue 19 checked:
//
//	cd bench && go run ./overload/cmd/overload                 # everything, 5 runs (about 12 minutes)
//	go run ./overload/cmd/overload -runs 1 -only step,hostile  # some scenarios
//	go run ./overload/cmd/overload -tokens 8 -service 5ms -deadline 100ms  # the server
//
// Run it on a quiet machine, without nice: every number is real time.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/grpc-resilience/resilience/bench/overload"
)

func main() {
	d := overload.DefaultConfig()
	runs := flag.Int("runs", 5, "runs of each scenario")
	only := flag.String("only", "", "comma-separated scenarios to run: "+strings.Join(overload.Scenarios, ", ")+" (default all)")
	tokens := flag.Int("tokens", d.Tokens, "the server's tokens (its concurrency)")
	service := flag.Duration("service", d.Service, "the time a call holds a token")
	deadline := flag.Duration("deadline", d.Deadline, "every call's deadline")
	quiet := flag.Bool("q", false, "no progress lines on stderr")
	queue := flag.Int("queue", 0, "grpc-resilience's limit: MaxQueue (0: the default, none)")
	queueWait := flag.Duration("queuewait", 0, "grpc-resilience's limit: MaxQueueWait")
	flag.Parse()
	overload.OurLimit.MaxQueue, overload.OurLimit.MaxQueueWait = *queue, *queueWait
	s := &overload.Suite{
		Config: overload.Config{Tokens: *tokens, Service: *service, Deadline: *deadline},
		Runs:   *runs,
	}
	if *only != "" {
		s.Only = strings.Split(*only, ",")
	}
	if !*quiet {
		s.Progress = os.Stderr
	}
	start := time.Now()
	if err := s.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "overload:", err)
		os.Exit(1)
	}
	fmt.Print(s.Markdown())
	fmt.Printf("\n(%d run(s) in %v)\n", *runs, time.Since(start).Round(time.Second))
}
