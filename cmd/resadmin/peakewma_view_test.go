package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/admin"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// endpointPolicy is a service config with the resilience_endpoint policy
// over the child policy child, given as JSON.
func endpointPolicy(child string) string {
	return `{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [` + child + `]}}]}`
}

// viewWithEndpoints serves a View that watches the endpoint channels over
// real gRPC (serveView) and over HTTP, and returns both addresses.
func viewWithEndpoints(t *testing.T) (addr string, hs *httptest.Server) {
	t.Helper()
	v, err := admin.New()
	if err != nil {
		t.Fatal(err)
	}
	hs = httptest.NewServer(v.Handler())
	t.Cleanup(hs.Close)
	return serveView(t, v), hs
}

// channelBlock returns resadmin's CHANNEL block of target: its CHANNEL line
// and its endpoint table.
func channelBlock(t *testing.T, addr, target string) string {
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

// get returns the body of a GET of url.
func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// jsonChannel returns the channel of target in the view's /view.json.
func jsonChannel(t *testing.T, hs *httptest.Server, target string) map[string]any {
	t.Helper()
	b := get(t, hs.URL+"/view.json")
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

// pageChannel returns the page's section of the channel of target: its
// heading and its endpoint table.
func pageChannel(t *testing.T, hs *httptest.Server, target string) string {
	t.Helper()
	s := string(get(t, hs.URL+"/"))
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

// echoCalls makes n Echo calls on the cluster's channel, each of which
// must succeed.
func echoCalls(t *testing.T, cl *resiliencetest.Cluster, n int) {
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

// TestChannelShowsOnlyTheChildPolicysSettingsInEffect: over a real channel
// and the admin view read through gRPC (resadmin's run) and HTTP
// (view.json, the page), peak_ewma's settings appear under peak_ewma,
// disappear under round_robin, and come back, updated, under peak_ewma.
// Under round_robin nothing measures latency, so no latency estimate may
// be shown: the estimate left from peak_ewma is not one the picks compare.
func TestChannelShowsOnlyTheChildPolicysSettingsInEffect(t *testing.T) {
	addr, hs := viewWithEndpoints(t)
	cl := resiliencetest.StartCluster(t, 2, nil,
		resiliencetest.WithServiceConfig(endpointPolicy(`{"peak_ewma": {"decayTime": "3600s", "endpointConcurrency": 2}}`)))
	target := cl.Conn.Target()
	echoCalls(t, cl, 20)

	ch := channelBlock(t, addr, target)
	if !strings.Contains(ch, "(resilience_endpoint, peak_ewma decayTime 1h0m0s endpointConcurrency 2)") || !strings.Contains(ch, "latency ") {
		t.Errorf("peak_ewma: resadmin's channel:\n%s", ch)
	}
	js := jsonChannel(t, hs, target)
	if js["decayTime"] != "3600s" || js["endpointConcurrency"] != "2" {
		t.Errorf("peak_ewma: view.json channel: %v", js)
	}

	if err := cl.SetServiceConfig(endpointPolicy(`{"round_robin": {}}`)); err != nil {
		t.Fatal(err)
	}
	echoCalls(t, cl, 4)
	ch = channelBlock(t, addr, target)
	if !strings.Contains(ch, "(resilience_endpoint, round_robin)") || strings.Contains(ch, "decayTime") {
		t.Errorf("round_robin: resadmin's channel line:\n%s", ch)
	}
	if strings.Contains(ch, "latency") {
		t.Errorf("round_robin: resadmin shows a latency estimate nothing measures (peak_ewma's, left over):\n%s", ch)
	}
	js = jsonChannel(t, hs, target)
	if _, ok := js["decayTime"]; ok {
		t.Errorf("round_robin: view.json channel has decayTime: %v", js)
	}
	for _, e := range js["endpoints"].([]any) {
		if l, ok := e.(map[string]any)["latency"]; ok {
			t.Errorf("round_robin: view.json endpoint has latency %v", l)
		}
	}
	if p := pageChannel(t, hs, target); strings.Contains(p, "latency") || strings.Contains(p, "decayTime") {
		t.Errorf("round_robin: the page shows peak_ewma's state:\n%s", p)
	}

	if err := cl.SetServiceConfig(endpointPolicy(`{"peak_ewma": {"decayTime": "2s"}}`)); err != nil {
		t.Fatal(err)
	}
	echoCalls(t, cl, 10)
	ch = channelBlock(t, addr, target)
	if !strings.Contains(ch, "(resilience_endpoint, peak_ewma decayTime 2s endpointConcurrency 4)") {
		t.Errorf("back to peak_ewma: resadmin's channel:\n%s", ch)
	}
	if p := pageChannel(t, hs, target); !strings.Contains(p, "(peak_ewma, decayTime 2s, endpointConcurrency 4)") {
		t.Errorf("back to peak_ewma: page:\n%s", p)
	}
}

// TestPageShowsAttemptsInFlightWithoutAnEstimate: under peak_ewma an endpoint whose
// calls are all still in flight has no latency estimate yet; its attempts
// in flight (what peak_ewma's picks compare then: Penalty + outstanding)
// should still be on the page, as resadmin's LOAD column shows them.
func TestPageShowsAttemptsInFlightWithoutAnEstimate(t *testing.T) {
	addr, hs := viewWithEndpoints(t)
	cl := resiliencetest.StartCluster(t, 1, nil,
		resiliencetest.WithServiceConfig(endpointPolicy(`{"peak_ewma": {}}`)))
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
	ch := channelBlock(t, addr, target)
	if !strings.Contains(ch, "3 in flight") {
		t.Errorf("resadmin:\n%s", ch)
	}
	if p := pageChannel(t, hs, target); !strings.Contains(p, "3 in flight") {
		t.Errorf("the page hides 3 attempts in flight of a peak_ewma endpoint with no estimate yet:\n%s", p)
	}
}
