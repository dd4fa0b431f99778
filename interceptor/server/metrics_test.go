package server

import (
	"context"
	"testing"
	"testing/synctest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestServerMetricsAfterAScriptedSequence runs first executions, a replay,
// a key reused with another request, coalesced duplicates (waiting and
// not), and calls on a failing store open and closed, and reads the
// server's instruments through the SDK's ManualReader.
func TestServerMetricsAfterAScriptedSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		newUnary := func(idem Idempotency) grpc.UnaryServerInterceptor {
			t.Helper()
			idem.Scope = SharedScope
			s, err := New(WithIdempotency(idem), WithMeterProvider(mp))
			if err != nil {
				t.Fatal(err)
			}
			return s.UnaryServerInterceptor()
		}
		memory := func() idempotency.Store {
			st, err := idempotency.NewMemoryStore()
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
		keyed := func(key string) context.Context {
			return metadata.NewIncomingContext(t.Context(), metadata.Pairs("idempotency-key", key))
		}
		release := make(chan struct{})
		h := func(_ context.Context, req any) (any, error) {
			if req.(*echov1.EchoRequest).GetMessage() == "slow" {
				<-release
			}
			return &echov1.EchoResponse{Message: "ok"}, nil
		}
		call := func(unary grpc.UnaryServerInterceptor, key, msg string) error {
			_, err := unary(keyed(key), &echov1.EchoRequest{Message: msg}, info, h)
			return err
		}
		// duplicates runs two calls with key at once, the second while the
		// first is in its handler, and returns their errors.
		duplicates := func(unary grpc.UnaryServerInterceptor, key string) (first, second error) {
			done := make(chan struct{})
			go func() { first = call(unary, key, "slow"); close(done) }()
			synctest.Wait() // the first is in its handler
			go func() { second = call(unary, key, "slow") }()
			synctest.Wait() // the second waits for it, or was refused
			close(release)
			<-done
			synctest.Wait()
			release = make(chan struct{})
			return first, second
		}

		waiting := newUnary(Idempotency{Store: memory()})
		if err := call(waiting, "a", "m"); err != nil { // execution
			t.Fatal(err)
		}
		if err := call(waiting, "a", "m"); err != nil { // replay from the store
			t.Fatal(err)
		}
		if err := call(waiting, "a", "other"); status.Code(err) != codes.FailedPrecondition { // mismatch
			t.Fatalf("key reused: %v, want FAILED_PRECONDITION", err)
		}
		if a, b := duplicates(waiting, "b"); a != nil || b != nil { // execution, a wait, a replay of the flight
			t.Fatalf("coalesced duplicates: %v, %v", a, b)
		}
		if a, b := duplicates(newUnary(Idempotency{Store: memory(), NoWait: true}), "c"); a != nil || status.Code(b) != codes.Aborted {
			t.Fatalf("duplicates without waiting: %v, %v, want nil, ABORTED", a, b)
		}
		if err := call(newUnary(Idempotency{Store: idemDownStore{}, FailOpen: true}), "d", "m"); err != nil {
			t.Fatalf("fail open: %v", err)
		}
		if err := call(newUnary(Idempotency{Store: idemDownStore{}}), "e", "m"); status.Code(err) != codes.Unavailable {
			t.Fatalf("fail closed: %v, want UNAVAILABLE", err)
		}

		got := collect(t, reader)
		const m = "grpc.method=resilience.echo.v1.EchoService/Echo"
		got.Expect(t, metricSrvExecutions, "{call}", map[string]float64{m: 3}) // a, b, c
		got.Expect(t, metricSrvReplays, "{call}", map[string]float64{
			m + ",resilience.idempotency.source=store": 1, m + ",resilience.idempotency.source=flight": 1,
		})
		got.Expect(t, metricSrvWaits, "{call}", map[string]float64{m + ",resilience.idempotency.wait=flight": 1})
		got.Expect(t, metricSrvConflicts, "{call}", map[string]float64{
			m + ",resilience.idempotency.conflict=mismatch": 1, m + ",resilience.idempotency.conflict=in_progress": 1,
		})
		got.Expect(t, metricSrvStoreErrors, "{error}", map[string]float64{
			m + ",resilience.idempotency.mode=fail_open,resilience.idempotency.op=claim":   1,
			m + ",resilience.idempotency.mode=fail_closed,resilience.idempotency.op=claim": 1,
		})
		// Claims: a, a, a (mismatch), b, c, d, e; completions: a, b, c.
		// Time stands still in the bubble: every duration is 0.
		got.Expect(t, metricSrvStoreDuration, "s", map[string]float64{
			"count:" + m + ",resilience.idempotency.op=claim": 7, "sum:" + m + ",resilience.idempotency.op=claim": 0,
			"count:" + m + ",resilience.idempotency.op=complete": 3, "sum:" + m + ",resilience.idempotency.op=complete": 0,
		})
	})
}

func TestWithMeterProviderRefusesNil(t *testing.T) {
	if _, err := New(WithMeterProvider(nil)); err == nil {
		t.Error("New(WithMeterProvider(nil)) = nil error, want one")
	}
}
