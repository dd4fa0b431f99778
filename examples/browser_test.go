package examples_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// chromium returns the path of the system's headless-capable Chromium
// (Debian's package chromium: apt-get install chromium chromium-driver,
// which .ci/run does). Without it the test skips, except under CI
// (CI set), where it fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium on PATH (chromium, chromium-browser, google-chrome): .ci/run installs Debian's chromium with apt-get")
	}
	t.Skip("no Chromium on PATH; apt-get install chromium chromium-driver (CI fails instead of skipping)")
	return ""
}

// row is one row of the page's "refusing calls now" table, as the browser
// renders it.
type row struct {
	Part    string `json:"part"`
	Subject string `json:"subject"`
	Cause   string `json:"cause"`
}

// TestBrowserShowsTheOpenBreakerAndTheEjectedEndpoint runs a front server
// forwarding to three backends: one fails every call, the other two fail
// every Lookup. Echo calls get the failing backend ejected (their retries
// succeed elsewhere); Lookup calls open Lookup's breaker. A real headless
// Chromium, started by the test, loads the front's admin page and finds
// both in "refusing calls now", each with its cause.
func TestBrowserShowsTheOpenBreakerAndTheEjectedEndpoint(t *testing.T) {
	chrome := chromium(t)
	lookupFails := writeFile(t, "faults.json", `{"faults": [{"methods": ["resilience.echo.v1.EchoService/Lookup"],
		"abort": {"grpcStatus": "UNAVAILABLE", "percentage": {"numerator": 100}}}]}`)
	var addrs []string
	for _, args := range [][]string{{"-fail-rate", "1"}, {"-faults", lookupFails}, {"-faults", lookupFails}} {
		_, a, _ := startServer(t, args...)
		addrs = append(addrs, a)
	}
	_, front, debug := startServer(t, "-forward", strings.Join(addrs, ","), "-forward-config", writeFile(t, "forward.json",
		`{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}],
		  "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]},
		  "circuitBreaker": {"consecutiveFailures": 3, "openDuration": "300s"}}],
		 "loadBalancingConfig": [{"resilience_endpoint": {"consecutiveFailures": 3, "baseEjectionTime": "300s",
		   "childPolicy": [{"round_robin": {}}]}}]}`))
	ec, admin := dialEcho(t, front)
	waitReady(t, admin, 3)

	// Echo until the failing backend is out of rotation.
	ejected := func(v *adminv1.View) bool {
		for _, ch := range v.GetChannels() {
			for _, e := range ch.GetEndpoints() {
				if strings.Join(e.GetAddresses(), ",") == addrs[0] && e.GetEjectedUntil() != nil {
					return true
				}
			}
		}
		return false
	}
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatal("200 Echo calls and the failing backend is still in rotation")
		}
		ctx, cancel := callCtx(t)
		err := echo(ctx, ec, "x")
		r, verr := admin.GetView(ctx, &adminv1.GetViewRequest{})
		cancel()
		if err != nil {
			t.Fatalf("Echo: %v (its retries should go to the good backends)", err)
		}
		if verr == nil && ejected(r.GetView()) {
			break
		}
	}
	// Lookup until its breaker rejects.
	for i := 0; ; i++ {
		if i == 50 {
			t.Fatal("50 failing Lookup calls and the breaker still admits")
		}
		ctx, cancel := callCtx(t)
		_, err := ec.Lookup(ctx, &echov1.LookupRequest{Message: "x"})
		cancel()
		if err != nil && strings.Contains(err.Error(), "circuit breaker open") {
			break
		}
	}

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chrome),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The first action starts the browser, which lives as long as bctx:
	// it runs without a timeout of its own (the test's bounds it); the
	// next ones are bounded.
	if err := chromedp.Do(bctx, chromedp.Navigate("http://"+debug+"/debug/resilience/")); err != nil {
		t.Fatalf("Chromium: loading the admin page: %v", err)
	}
	ctx, cancel := context.WithTimeout(bctx, bound)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`tr.refusing`))); err != nil {
		t.Fatalf("Chromium: the page shows no row under refusing calls now: %v", err)
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil || title != "resilience: admin view" {
		t.Errorf("page title %q, %v", title, err)
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]row](`Array.from(document.querySelectorAll("tr.refusing")).map(r => ({
		part: r.dataset.part, subject: r.dataset.subject, cause: r.querySelector("td.cause").textContent}))`))
	if err != nil {
		t.Fatalf("Chromium: reading the rows: %v", err)
	}
	var breaker, endpoint *row
	for i, r := range rows {
		switch {
		case r.Part == "breaker" && r.Subject == lookup:
			breaker = &rows[i]
		case r.Part == "endpoint" && r.Subject == addrs[0]:
			endpoint = &rows[i]
		}
	}
	if breaker == nil || !strings.Contains(breaker.Cause, "breaker open: opened on failures") ||
		!strings.Contains(breaker.Cause, "UNAVAILABLE ×") || !strings.Contains(breaker.Cause, `"faultinject: injected abort"`) {
		t.Errorf("the page shows no open breaker of %s with its failures; refusing rows: %+v", lookup, rows)
	}
	if endpoint == nil || !strings.Contains(endpoint.Cause, "ejected (ejection 1) after 3 failures in a row") {
		t.Errorf("the page shows no ejected endpoint %s with its failures; refusing rows: %+v", addrs[0], rows)
	}
	t.Logf("the browser read %d rows under refusing calls now: %+v", len(rows), rows)
}
