package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/interceptor/admin"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

func adv42Policy(child string) string {
	return `{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [` + child + `]}}]}`
}

// adv42Admin serves a View with the endpoint channels over real gRPC
// (loopback TCP) and over HTTP.
func adv42Admin(t *testing.T) (addr string, hs *httptest.Server) {
	t.Helper()
	v, err := admin.New()
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	admin.Register(gs, v)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	hs = httptest.NewServer(v.Handler())
	t.Cleanup(hs.Close)
	return lis.Addr().String(), hs
}

// adv42Channel returns resadmin's CHANNEL block of target: its CHANNEL line
// and its endpoint table.
func adv42Channel(t *testing.T, addr, target string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"-addr", addr}, &out, &errOut); code != exitOK {
		t.Fatalf("resadmin: exit %d: %s", code, errOut.String())
	}
	s := out.String()
	i := strings.Index(s, "CHANNEL "+target+" ")
	if i < 0 {
		t.Fatalf("no CHANNEL %s in:\n%s", target, s)
	}
	s = s[i:]
	if j := strings.Index(s, "\n\n"); j >= 0 {
		s = s[:j]
	}
	return s
}

func adv42JSONChannel(t *testing.T, hs *httptest.Server, target string) map[string]any {
	t.Helper()
	resp, err := http.Get(hs.URL + "/view.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v struct{ Channels []map[string]any }
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("view.json: %v\n%s", err, b)
	}
	for _, ch := range v.Channels {
		if ch["target"] == target {
			return ch
		}
	}
	t.Fatalf("view.json has no channel %s:\n%s", target, b)
	return nil
}

func adv42Page(t *testing.T, hs *httptest.Server, target string) string {
	t.Helper()
	resp, err := http.Get(hs.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	s := string(b)
	i := strings.Index(s, "<h3>channel "+target)
	if i < 0 {
		t.Fatalf("page has no channel %s", target)
	}
	s = s[i:]
	if j := strings.Index(s, "</table>"); j >= 0 {
		s = s[:j]
	}
	return s
}

func adv42Calls(t *testing.T, cl *resiliencetest.Cluster, n int) {
	t.Helper()
	echo := cl.EchoClient()
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := echo.Echo(ctx, &echov1.EchoRequest{Message: "x"})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdv42ChildSwitchShowsOnlyTheSettingsInEffect: over a real channel
// and the admin view read through gRPC (resadmin's run) and HTTP
// (view.json, the page), peak_ewma's settings appear under peak_ewma,
// disappear under round_robin, and come back, updated, under peak_ewma.
// Under round_robin nothing measures latency, so no latency estimate may
// be shown: the estimate left from peak_ewma is not one the picks compare.
func TestAdv42ChildSwitchShowsOnlyTheSettingsInEffect(t *testing.T) {
	addr, hs := adv42Admin(t)
	cl := resiliencetest.StartCluster(t, 2, nil,
		resiliencetest.WithServiceConfig(adv42Policy(`{"peak_ewma": {"decayTime": "3600s", "endpointConcurrency": 2}}`)))
	target := cl.Conn.Target()
	adv42Calls(t, cl, 20)

	ch := adv42Channel(t, addr, target)
	if !strings.Contains(ch, "(resilience_endpoint, peak_ewma decayTime 1h0m0s endpointConcurrency 2)") || !strings.Contains(ch, "latency ") {
		t.Errorf("peak_ewma: resadmin's channel:\n%s", ch)
	}
	js := adv42JSONChannel(t, hs, target)
	if js["decayTime"] != "3600s" || js["endpointConcurrency"] != "2" {
		t.Errorf("peak_ewma: view.json channel: %v", js)
	}

	if err := cl.SetServiceConfig(adv42Policy(`{"round_robin": {}}`)); err != nil {
		t.Fatal(err)
	}
	adv42Calls(t, cl, 4)
	ch = adv42Channel(t, addr, target)
	if !strings.Contains(ch, "(resilience_endpoint, round_robin)") || strings.Contains(ch, "decayTime") {
		t.Errorf("round_robin: resadmin's channel line:\n%s", ch)
	}
	if strings.Contains(ch, "latency") {
		t.Errorf("round_robin: resadmin shows a latency estimate nothing measures (peak_ewma's, left over):\n%s", ch)
	}
	js = adv42JSONChannel(t, hs, target)
	if _, ok := js["decayTime"]; ok {
		t.Errorf("round_robin: view.json channel has decayTime: %v", js)
	}
	for _, e := range js["endpoints"].([]any) {
		if l, ok := e.(map[string]any)["latency"]; ok {
			t.Errorf("round_robin: view.json endpoint has latency %v", l)
		}
	}
	if p := adv42Page(t, hs, target); strings.Contains(p, "latency") || strings.Contains(p, "decayTime") {
		t.Errorf("round_robin: the page shows peak_ewma's state:\n%s", p)
	}

	if err := cl.SetServiceConfig(adv42Policy(`{"peak_ewma": {"decayTime": "2s"}}`)); err != nil {
		t.Fatal(err)
	}
	adv42Calls(t, cl, 10)
	ch = adv42Channel(t, addr, target)
	if !strings.Contains(ch, "(resilience_endpoint, peak_ewma decayTime 2s endpointConcurrency 4)") {
		t.Errorf("back to peak_ewma: resadmin's channel:\n%s", ch)
	}
	if p := adv42Page(t, hs, target); !strings.Contains(p, "(peak_ewma, decayTime 2s, endpointConcurrency 4)") {
		t.Errorf("back to peak_ewma: page:\n%s", p)
	}
}

// TestAdv42InFlightWithoutEstimate: under peak_ewma an endpoint whose
// calls are all still in flight has no latency estimate yet; its attempts
// in flight (what peak_ewma's picks compare then: Penalty + outstanding)
// should still be on the page, as resadmin's LOAD column shows them.
func TestAdv42InFlightWithoutEstimate(t *testing.T) {
	addr, hs := adv42Admin(t)
	cl := resiliencetest.StartCluster(t, 1, nil,
		resiliencetest.WithServiceConfig(adv42Policy(`{"peak_ewma": {}}`)))
	target := cl.Conn.Target()
	release := make(chan struct{})
	arrived := make(chan struct{}, 8)
	cl.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
		arrived <- struct{}{}
		<-release
		return resiliencetest.Step{}
	})
	done := make(chan struct{})
	echo := cl.EchoClient()
	for range 3 {
		go func() {
			defer func() { done <- struct{}{} }()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = echo.Echo(ctx, &echov1.EchoRequest{Message: "x"})
		}()
	}
	for range 3 {
		<-arrived
	}
	defer func() {
		close(release)
		for range 3 {
			<-done
		}
	}()
	ch := adv42Channel(t, addr, target)
	if !strings.Contains(ch, "3 in flight") {
		t.Errorf("resadmin:\n%s", ch)
	}
	if p := adv42Page(t, hs, target); !strings.Contains(p, "3 in flight") {
		t.Errorf("the page hides 3 attempts in flight of a peak_ewma endpoint with no estimate yet:\n%s", p)
	}
}
