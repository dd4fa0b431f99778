package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "-config is required"},
		{[]string{"-config", "c.json", "-method", "Delete"}, `-method "Delete": want Echo or Lookup`},
		{[]string{"-config", "c.json", "-concurrency", "0"}, "-concurrency 0: must be at least 1"},
		{[]string{"-config", "c.json", "-rate", "-1"}, "-rate -1: must not be negative"},
		{[]string{"-config", "c.json", "-duration", "0s"}, "-duration and -timeout must be positive"},
		{[]string{"-config", "/nonexistent/c.json"}, "-config: open /nonexistent/c.json: no such file or directory"},
		{[]string{"-config", "config.json", "extra"}, `unexpected argument "extra"`},
		{[]string{"-config", "config.json", "-addr", "127.0.0.1:1,,127.0.0.1:2", "-metrics-addr", "", "-duration", "1ns"},
			`-addr "127.0.0.1:1,,127.0.0.1:2": an empty address`},
	}
	for _, tt := range tests {
		err := run(context.Background(), tt.args, io.Discard, io.Discard)
		if err == nil || err.Error() != tt.want {
			t.Errorf("run(%q) = %v, want %s", tt.args, err, tt.want)
		}
	}
}

// The shipped config.json parses.
func TestShippedConfig(t *testing.T) {
	err := run(context.Background(), []string{"-config", "config.json", "-addr", "127.0.0.1:1", "-metrics-addr", "", "-duration", "1ns"}, io.Discard, io.Discard)
	if err != nil {
		t.Errorf("run with config.json = %v", err)
	}
}

func TestSummaryLine(t *testing.T) {
	st := newStats()
	for range 3 {
		st.record(codes.OK)
	}
	st.record(codes.Unavailable)
	st.retries.Add(2)
	var out bytes.Buffer
	st.print(&out, false, "closed")
	st.record(codes.OK)
	st.print(&out, true, "open")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	_, period, _ := strings.Cut(lines[0], " ")
	if want := "calls=4 ok=3 codes=OK:3,UNAVAILABLE:1 attempts/call=1.50 breaker=closed"; period != want {
		t.Errorf("period line = %q, want %q", period, want)
	}
	if want := "total calls=5 ok=4 codes=OK:4,UNAVAILABLE:1 attempts/call=1.40 breaker=open"; lines[1] != want {
		t.Errorf("total line = %q, want %q", lines[1], want)
	}
}

// TestAdminViewOverGRPC: with -admin-addr the client serves its admin view
// over gRPC, for cmd/resadmin: the view has the client registered as
// "example", with the configuration's retry throttling.
func TestAdminViewOverGRPC(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-config", "config.json", "-addr", "127.0.0.1:1", "-metrics-addr", "",
			"-admin-addr", "127.0.0.1:0", "-duration", "1m"}, w, io.Discard)
		_ = w.Close()
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run() = %v", err)
		}
	}()
	sc := bufio.NewScanner(out)
	var addr string
	for addr == "" && sc.Scan() {
		addr, _ = strings.CutPrefix(sc.Text(), "admin listening on ")
	}
	go func() { _, _ = io.Copy(io.Discard, out) }() // the periodic summary lines
	if addr == "" {
		t.Fatalf("no \"admin listening on\" line (%v)", sc.Err())
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := adminv1.NewAdminServiceClient(conn).GetView(ctx, &adminv1.GetViewRequest{})
	if err != nil {
		t.Fatalf("GetView() = %v", err)
	}
	clients := resp.GetView().GetClients()
	if len(clients) != 1 || clients[0].GetName() != "example" || clients[0].GetRetryThrottling() == nil {
		t.Errorf("GetView() clients = %v, want one, \"example\", with its retry throttling", clients)
	}
}
