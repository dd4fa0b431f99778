package examples_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// dashboardPath is the Grafana dashboard shipped with the examples.
const dashboardPath = "dashboards/grafana.json"

// dashboard is the part of a Grafana dashboard that holds queries.
type dashboard struct {
	Links      []dashboardLink  `json:"links"`
	Panels     []dashboardPanel `json:"panels"`
	Templating struct {
		List []struct {
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// dashboardLink is a link of the dashboard or of a panel.
type dashboardLink struct {
	Title string `json:"title"`
	URL   string `json:"url"`
}

type dashboardPanel struct {
	Title   string          `json:"title"`
	Links   []dashboardLink `json:"links"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"` // a collapsed row's
}

// dashboardQueries returns every PromQL query of the dashboard: its
// panels' targets and its template variables' queries.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var out []string
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) == nil && q.Query != "" {
			out = append(out, q.Query)
		}
	}
	return out
}

var (
	// promStrings, promLabels and promRanges are the parts of a PromQL
	// expression that hold no metric name: string literals, label
	// matchers, range and subquery selectors, and the label lists of
	// by, without, on, ignoring, group_left and group_right.
	promStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promLabels    = regexp.MustCompile(`\{[^}]*\}`)
	promRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promLabelList = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promLabelFunc = regexp.MustCompile(`\blabel_values\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{[^}]*\}\s*)?,[^)]*\)`)
	promIdent     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression (or a Grafana
// label_values query) reads, in order, each once.
func metricNames(expr string) []string {
	expr = promLabelFunc.ReplaceAllString(expr, "$1")
	for _, re := range []*regexp.Regexp{promStrings, promLabels, promRanges, promLabelList} {
		expr = re.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, loc := range promIdent.FindAllStringIndex(expr, -1) {
		name := expr[loc[0]:loc[1]]
		rest := strings.TrimLeft(expr[loc[1]:], " \t\n")
		switch {
		case strings.HasPrefix(rest, "("), promKeywords[strings.ToLower(name)]:
			continue // a function, an aggregation or a keyword
		case loc[0] > 0 && (expr[loc[0]-1] == '$' || expr[loc[0]-1] >= '0' && expr[loc[0]-1] <= '9' || expr[loc[0]-1] == '.'):
			continue // a Grafana variable or part of a number
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// TestDashboardQueriesNameMetrics pins the name extraction the end-to-end
// check relies on, and that every query of the dashboard reads a metric.
func TestDashboardQueriesNameMetrics(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum by (grpc_method, grpc_status) (rate(resilience_client_attempts_total{grpc_method=~"$method"}[$__rate_interval]))`,
			[]string{"resilience_client_attempts_total"}},
		{`histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m]))) / ignoring (x) b_count offset 1m and on(y) c`,
			[]string{"a_bucket", "b_count", "c"}},
		{`label_values(resilience_client_attempts_total, grpc_method)`, []string{"resilience_client_attempts_total"}},
		{`label_values(target_info{job=~"$job"}, instance)`, []string{"target_info"}},
		{`max without (instance) (up{job="a{b}"} == 1e3)`, []string{"up"}},
	}
	for _, tt := range tests {
		if got := metricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tt.expr, got, tt.want)
		}
	}
	queries := dashboardQueries(t)
	if len(queries) < 10 {
		t.Fatalf("%s has %d queries, want the dashboard's", dashboardPath, len(queries))
	}
	for _, q := range queries {
		if len(metricNames(q)) == 0 {
			t.Errorf("%s: query %q reads no metric", dashboardPath, q)
		}
	}
}

// requireDashboardMetrics fails t unless every metric a query of the
// dashboard reads appears in what the endpoints' /metrics serve, polling
// until bound for the series that take some load to appear.
func requireDashboardMetrics(t *testing.T, endpoints ...string) {
	t.Helper()
	var want []string
	for _, q := range dashboardQueries(t) {
		for _, n := range metricNames(q) {
			if !slices.Contains(want, n) {
				want = append(want, n)
			}
		}
	}
	deadline := time.Now().Add(bound)
	var missing []string
	for {
		seen := map[string]bool{}
		for _, addr := range endpoints {
			for name := range scrapedNames(addr) {
				seen[name] = true
			}
		}
		missing = missing[:0]
		for _, n := range want {
			if !seen[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			t.Logf("the dashboard's %d metrics are all in the scrape", len(want))
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling an outside process, not waiting for time
	}
	t.Errorf("%s reads metrics no example serves after %v: %s", dashboardPath, bound, strings.Join(missing, ", "))
}

// scrapedNames returns the names of the samples addr's /metrics serves.
func scrapedNames(addr string) map[string]bool {
	out := map[string]bool{}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			out[line[:i]] = true
		}
	}
	return out
}

// dashboardServerFlags returns the flags that make examples/server serve
// every series the dashboard reads: a concurrency limit of 1 on Lookup and
// a delay on it, so that concurrent Lookups are shed, and a rate limit of
// one ServerStream an hour, so that a second stream is rate-limited
// (driveDashboardSeries). The example client's load calls Echo only.
func dashboardServerFlags(t *testing.T, dir string) []string {
	t.Helper()
	limits := dir + "/limits.json"
	faults := dir + "/faults.json"
	for path, doc := range map[string]string{
		limits: `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Lookup"}],
			"concurrencyLimit": {"algorithm": "aimd", "initialLimit": 1, "minLimit": 1, "maxLimit": 1}},
			{"name": [{"service": "resilience.echo.v1.EchoService", "method": "ServerStream"}],
			"rateLimits": [{"name": "dashboard-streams", "rate": 1, "per": "3600s", "burst": 1, "key": "shared"}]}]}`,
		faults: `{"faults": [{"methods": ["/resilience.echo.v1.EchoService/Lookup"], "delay": {"fixedDelay": "0.05s"}}]}`,
	} {
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"-server-config", limits, "-faults", faults}
}

// driveDashboardSeries makes the calls, beside the example client's load,
// that the dashboard's server panels need: concurrent Lookups over the
// limit of 1 (shed and admitted), a keyed Echo sent again once it
// succeeded (a replay), and ServerStreams until one is rate-limited.
func driveDashboardSeries(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	stub := echov1.NewEchoServiceClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	var wg sync.WaitGroup
	var shed atomic.Int32
	for range 8 {
		wg.Go(func() {
			if _, err := stub.Lookup(ctx, &echov1.LookupRequest{Message: "x"}); status.Code(err) == codes.ResourceExhausted {
				shed.Add(1)
			}
		})
	}
	wg.Wait()
	if shed.Load() == 0 {
		t.Error("8 concurrent Lookups over a limit of 1: none shed")
	}
	keyed := metadata.AppendToOutgoingContext(ctx, "idempotency-key", "dashboard-replay")
	for i := 0; ; i++ { // the server fails 30% of attempts: until one succeeds
		if _, err := stub.Echo(keyed, &echov1.EchoRequest{Message: "replay"}); err == nil {
			break
		} else if i == 50 {
			t.Fatalf("a keyed Echo failed 50 times: %v", err)
		}
	}
	if _, err := stub.Echo(keyed, &echov1.EchoRequest{Message: "replay"}); err != nil {
		t.Errorf("the keyed Echo's duplicate = %v, want its stored reply", err)
	}
	for i := 0; ; i++ { // the first stream takes the hour's one token (the server fails 30% of calls)
		err := readStream(ctx, stub)
		if status.Code(err) == codes.ResourceExhausted && strings.Contains(status.Convert(err).Message(), "over the rate limit") {
			break
		} else if i == 50 {
			t.Fatalf("50 ServerStreams and none rate-limited: %v", err)
		}
	}
}

// readStream opens a ServerStream and reads it to its end; nil when it
// ended well.
func readStream(ctx context.Context, stub echov1.EchoServiceClient) error {
	st, err := stub.ServerStream(ctx, &echov1.ServerStreamRequest{Message: "x"})
	if err != nil {
		return err
	}
	for {
		if _, err := st.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// dashboardLinks returns the URLs of the dashboard's links and of its
// panels' links.
func dashboardLinks(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var out []string
	for _, l := range d.Links {
		out = append(out, l.URL)
	}
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			for _, l := range p.Links {
				out = append(out, l.URL)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// requireDashboardLinks fails t unless every link of the dashboard,
// ${instance} read as each of the instances (the debug ports the
// dashboard's series are scraped from), serves the admin page.
func requireDashboardLinks(t *testing.T, instances ...string) {
	t.Helper()
	links := dashboardLinks(t)
	if len(links) == 0 {
		t.Fatalf("%s links nowhere, want the admin page", dashboardPath)
	}
	for _, inst := range instances {
		for _, l := range links {
			u := strings.ReplaceAll(l, "${instance}", inst)
			resp, err := http.Get(u)
			if err != nil {
				t.Errorf("the dashboard's link %s: %v", u, err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<title>resilience: admin view</title>") {
				t.Errorf("the dashboard's link %s: %d, not the admin page", u, resp.StatusCode)
			}
		}
	}
}
