package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// TestChannelShowsPeakEWMA: a channel under peak_ewma prints the settings
// in effect and each endpoint's load (attempts in flight, latency
// estimate); one under round_robin prints neither setting nor latency.
func TestChannelShowsPeakEWMA(t *testing.T) {
	var b bytes.Buffer
	printChannel(&b, &adminv1.Channel{Target: "dns:///orders", ChildPolicy: "peak_ewma",
		DecayTime: durationpb.New(10 * time.Second), EndpointConcurrency: 4,
		Endpoints: []*adminv1.Endpoint{
			{Addresses: []string{"10.0.0.1:443"}, Connectivity: "READY", Outstanding: 3, Latency: durationpb.New(6 * time.Millisecond)},
			{Addresses: []string{"10.0.0.2:443"}, Connectivity: "READY"},
		}})
	out := b.String()
	for _, want := range []string{"(resilience_endpoint, peak_ewma decayTime 10s endpointConcurrency 4)",
		"LOAD", "3 in flight, latency 6ms", "0 in flight"} {
		if !strings.Contains(out, want) {
			t.Errorf("peak_ewma channel lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	printChannel(&b, &adminv1.Channel{Target: "dns:///orders", ChildPolicy: "round_robin",
		Endpoints: []*adminv1.Endpoint{{Addresses: []string{"10.0.0.1:443"}, Connectivity: "READY", Outstanding: 1}}})
	out = b.String()
	if !strings.Contains(out, "(resilience_endpoint, round_robin)") || strings.Contains(out, "decayTime") || strings.Contains(out, "latency") {
		t.Errorf("round_robin channel:\n%s\nwant its child policy alone, and no latency", out)
	}
}
