// Command compare runs the side-by-side comparison of grpc-resilience with
// its peers, prints the markdown tables and writes BENCHMARKS.md.
//
//	cd bench && go run ./cmd/compare                 # default size, under 5 minutes on 2 cores
//	go run ./cmd/compare -size tiny -out ''          # a quick look, no file written
//	go run ./cmd/compare -run 'tail|isolation'       # some scenarios only
//	go run ./cmd/compare -note 'busy machine'       # a bold note under the title
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/grpc-resilience/resilience/bench"
)

// scenarios lists what the command runs, in report order. A scenario from
// another package (e.g. bench/overload) is one more entry here.
func scenarios() []bench.Scenario {
	return bench.All()
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func run() error {
	size := flag.String("size", "default", "workload size: default or tiny")
	only := flag.String("run", "", "run only the scenarios whose name matches this regular expression")
	out := flag.String("out", "BENCHMARKS.md", "write the report to this file (empty: do not write)")
	note := flag.String("note", "", "a note printed in bold under the report's title, e.g. that the machine was busy")
	flag.Parse()

	var sz bench.Size
	switch *size {
	case "default":
		sz = bench.Default
	case "tiny":
		sz = bench.Tiny
	default:
		return fmt.Errorf("-size %q: want default or tiny", *size)
	}
	re, err := regexp.Compile(*only)
	if err != nil {
		return fmt.Errorf("-run %q: %w", *only, err)
	}
	var selected []bench.Scenario
	for _, s := range scenarios() {
		if re.MatchString(s.Name) {
			selected = append(selected, s)
		}
	}
	if len(selected) == 0 {
		return fmt.Errorf("-run %q matches no scenario", *only)
	}

	start := time.Now()
	results := bench.Run(context.Background(), selected, sz, os.Stderr)
	var buf bytes.Buffer
	bench.WriteReport(&buf, results, sz, bench.ThisMachine(), time.Since(start), *note)
	if _, err := os.Stdout.Write(buf.Bytes()); err != nil {
		return err
	}
	if *out != "" {
		if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "wrote %s\n", *out)
	}
	for _, r := range results {
		if r.Err != nil {
			return fmt.Errorf("scenario %q failed: %w", r.Scenario.Name, r.Err)
		}
	}
	return nil
}
