package server

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestStreamConcurrencyLimit: with a limit of one and a queue of one
// (50ms), a stream of an opted-in method holds the slot for its whole
// life: a stream of a method not opted in is not limited; a second stream
// waits in the queue and is shed after 50ms; a unary call and a third
// stream find the queue full and are shed at once; later a queued stream
// runs when the one before it ends. At the end nothing is held, and
// streams gave the limit no latency sample.
func TestStreamConcurrencyLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1,
			MaxQueue: 1, MaxQueueWait: 50 * time.Millisecond})
		l.Streams = []string{"pkg.S"}
		srv := newLimitServer(t, l)
		sicpt := srv.StreamServerInterceptor()
		results := make(chan error, 4)
		stream := func(method string, life time.Duration) {
			ss := &srvStream{ctx: t.Context()}
			go func() {
				results <- sicpt(nil, ss, &grpc.StreamServerInfo{FullMethod: method}, func(any, grpc.ServerStream) error {
					time.Sleep(life)
					return nil
				})
			}()
			synctest.Wait()
		}
		start := time.Now()
		stream("/pkg.S/Watch", 100*time.Millisecond) // holds the slot for 100ms
		if st := srv.LimitStatuses()[0]; st.InFlight != 1 {
			t.Fatalf("with a stream open: %+v, want 1 in flight", st)
		}
		stream("/other.S/Watch", 0) // not opted in: runs
		if err := <-results; err != nil || time.Since(start) != 0 {
			t.Errorf("stream not opted in: %v after %v, want nil at once", err, time.Since(start))
		}
		stream("/pkg.S/Watch", 10*time.Millisecond) // queued; the queue then waits only 50ms
		_, err := srv.UnaryServerInterceptor()(t.Context(), nil, &grpc.UnaryServerInfo{FullMethod: "/other.S/Get"},
			func(context.Context, any) (any, error) { return nil, nil })
		if status.Code(err) != codes.ResourceExhausted || time.Since(start) != 0 {
			t.Errorf("unary call while a stream holds the slot: %v, want RESOURCE_EXHAUSTED at once", err)
		}
		stream("/pkg.S/Watch", 0) // the queue is full: shed
		if err := <-results; status.Code(err) != codes.ResourceExhausted || time.Since(start) != 0 {
			t.Errorf("third stream: %v after %v, want RESOURCE_EXHAUSTED at once", err, time.Since(start))
		}
		if err := <-results; status.Code(err) != codes.ResourceExhausted || time.Since(start) != 50*time.Millisecond {
			t.Errorf("queued stream: %v after %v, want RESOURCE_EXHAUSTED after 50ms", err, time.Since(start))
		}
		if err := <-results; err != nil || time.Since(start) != 100*time.Millisecond {
			t.Errorf("first stream: %v after %v, want nil after 100ms", err, time.Since(start))
		}
		stream("/pkg.S/Watch", 30*time.Millisecond)
		stream("/pkg.S/Watch", 10*time.Millisecond) // queued: runs after the first
		for range 2 {
			if err := <-results; err != nil {
				t.Errorf("stream: %v", err)
			}
		}
		if d := time.Since(start); d != 140*time.Millisecond {
			t.Errorf("queued stream ended after %v, want 140ms", d)
		}
		st := srv.LimitStatuses()[0]
		if st.InFlight != 0 || st.Queued != 0 || st.Admitted[wire.Critical] != 3 || st.SmoothedRTT != 0 {
			t.Errorf("after: %+v, want nothing held, 3 admitted, no latency sample", st)
		}
	})
}

// TestStreamLimitReleasedOnPanic: a stream's slot is released when its
// handler panics, and the panic goes on up.
func TestStreamLimitReleasedOnPanic(t *testing.T) {
	srv := newLimitServer(t, Limits{Streams: []string{"/pkg.S/Watch"}, Config: serviceconfig.ServerConfig{
		MethodConfig: []serviceconfig.ServerMethodConfig{
			methodLimitOf(t, "/pkg.S/Watch", serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1})}}})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not go on up")
			}
		}()
		ss := &srvStream{ctx: metadata.NewIncomingContext(t.Context(), metadata.Pairs(wire.CriticalityKey, "SHEDDABLE"))}
		_ = srv.StreamServerInterceptor()(nil, ss, &grpc.StreamServerInfo{FullMethod: "/pkg.S/Watch"}, func(any, grpc.ServerStream) error {
			panic("stream handler panic")
		})
	}()
	if st := srv.LimitStatuses()[0]; st.InFlight != 0 || st.Admitted[wire.Sheddable] != 1 {
		t.Errorf("after the panic: %+v, want nothing held, 1 SHEDDABLE admitted", st)
	}
}

// TestStreamConcurrencyLimitOptionErrors: the errors of Limits.Streams,
// from Validate and New alike.
func TestStreamConcurrencyLimitOptionErrors(t *testing.T) {
	tests := []struct {
		name string
		l    Limits
		want string
	}{
		{"bad name", Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{}}, Streams: []string{"pkg.S", "/pkg.S"}},
			`server: Limits.Streams[1]: `},
		{"no limit", Limits{Streams: []string{"pkg.S"}}, "no concurrency limit covers it"},
		{"only CPU shedding", Limits{CPU: &CPUShedding{}, Streams: []string{"pkg.S"}}, "no concurrency limit covers it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantLimitsError(t, tt.l, tt.want) })
	}
}
