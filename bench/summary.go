package bench

import (
	"fmt"
	"slices"
	"strings"
)

// Summarize folds several runs of the same scenarios into one result per
// scenario whose cells read "min / median / max" over the runs, for cells
// that are numbers in every run ("1.03×", "+2.0", "3.8%", "0.95"); other
// cells are the first run's. It is how cmd/compare -repeat reports
// real-time numbers: several runs, never one.
func Summarize(runs [][]Result) []Result {
	if len(runs) == 0 {
		return nil
	}
	out := make([]Result, 0, len(runs[0]))
	for i, first := range runs[0] {
		r := Result{Scenario: first.Scenario, Err: first.Err}
		for _, run := range runs {
			if i >= len(run) || run[i].Err != nil {
				r.Err = fmt.Errorf("a run of %q failed", first.Scenario.Name)
			}
		}
		if r.Err == nil {
			for ti, t := range first.Tables {
				r.Tables = append(r.Tables, summarizeTable(t, runs, i, ti))
			}
		}
		out = append(out, r)
	}
	return out
}

// summarizeTable returns table ti of scenario i over runs, with each
// numeric cell as min / median / max.
func summarizeTable(t Table, runs [][]Result, i, ti int) Table {
	s := Table{Title: t.Title, Header: t.Header, Notes: t.Notes}
	if s.Title == "" {
		s.Title = fmt.Sprintf("min / median / max over %d runs", len(runs))
	} else {
		s.Title += fmt.Sprintf(" (min / median / max over %d runs)", len(runs))
	}
	for ri, row := range t.Rows {
		out := slices.Clone(row)
		for ci := 1; ci < len(row); ci++ {
			var xs []float64
			for _, run := range runs {
				tables := run[i].Tables
				if ti >= len(tables) || ri >= len(tables[ti].Rows) || ci >= len(tables[ti].Rows[ri]) {
					xs = nil
					break
				}
				c := tables[ti].Rows[ri][ci]
				if !isNumber(c) {
					xs = nil
					break
				}
				xs = append(xs, number(c))
			}
			if len(xs) == len(runs) {
				out[ci] = spread(xs, row[ci])
			}
		}
		s.Rows = append(s.Rows, out)
	}
	return s
}

// spread formats xs as min / median / max in the style of sample, a cell
// of the first run.
func spread(xs []float64, sample string) string {
	slices.Sort(xs)
	format := func(x float64) string {
		switch {
		case strings.HasSuffix(sample, "×"):
			return fmt.Sprintf("%.2f×", x)
		case strings.HasSuffix(sample, "%"):
			return fmt.Sprintf("%.1f%%", x)
		case strings.HasPrefix(sample, "+") || strings.HasPrefix(sample, "-"):
			return signed(x)
		}
		return fmt.Sprintf("%.2f", x)
	}
	return format(xs[0]) + " / " + format(xs[len(xs)/2]) + " / " + format(xs[len(xs)-1])
}
