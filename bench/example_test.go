package bench_test

import (
	"context"
	"os"

	"github.com/grpc-resilience/resilience/bench"
)

// A scenario is one entry: a name, a documented workload and a Run that
// returns tables. Run runs a list of them and Markdown renders the results.
func ExampleScenario() {
	echo := bench.Scenario{
		Name:     "example",
		Workload: "A fixed table, to show the shape of a scenario.",
		Run: func(_ context.Context, sz bench.Size) ([]bench.Table, error) {
			return []bench.Table{{
				Header: []string{"peer", "calls"},
				Rows:   [][]string{{"bare (no interceptor)", "1.00×"}},
				Notes:  []string{"size " + sz.Name},
			}}, nil
		},
	}
	results := bench.Run(context.Background(), []bench.Scenario{echo}, bench.Tiny, nil)
	bench.Markdown(os.Stdout, results)
	// Output:
	// ## example
	//
	// A fixed table, to show the shape of a scenario.
	//
	// | peer | calls |
	// |---|---|
	// | bare (no interceptor) | 1.00× |
	//
	// - size tiny
}
