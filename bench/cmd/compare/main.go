// Command compare runs the side-by-side comparison of grpc-resilience with
// its peers, prints the markdown tables and writes BENCHMARKS.md.
//
//	cd bench && go run ./cmd/compare                 # default size, under 5 minutes on 2 cores
//	go run ./cmd/compare -size tiny -out ''          # a quick look, no file written
//	go run ./cmd/compare -run 'tail|isolation'       # some scenarios only
//	go run ./cmd/compare -note 'busy machine'       # a bold note under the title
//	go run ./cmd/compare -run triples -repeat 5     # 5 runs, then min / median / max of each cell
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

// flagSet reports whether the flag named was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
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
	repeat := flag.Int("repeat", 1, "run the scenarios this many times and report each cell as min / median / max (nothing is written unless -out is set explicitly)")
	flag.Parse()
	if *repeat < 1 {
		return fmt.Errorf("-repeat %d: want at least 1", *repeat)
	}
	if *repeat > 1 && !flagSet("out") {
		*out = ""
	}

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
	if *repeat > 1 {
		runs := [][]bench.Result{results}
		for i := 1; i < *repeat; i++ {
			fmt.Fprintf(os.Stderr, "run %d of %d\n", i+1, *repeat)
			runs = append(runs, bench.Run(context.Background(), selected, sz, os.Stderr))
		}
		for i, run := range runs {
			fmt.Printf("# Run %d of %d\n\n", i+1, *repeat)
			bench.Markdown(os.Stdout, run)
		}
		results = bench.Summarize(runs)
	}
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
