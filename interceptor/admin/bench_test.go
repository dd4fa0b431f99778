package admin

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// BenchmarkRefusalInAnEpisode measures what a refused call pays the view
// while its part refuses steadily (one episode, its count growing): the
// client's stop hook for a full bulkhead, and the server's refusal hook for
// a limit's shed, serially and from every processor at once.
func BenchmarkRefusalInAnEpisode(b *testing.B) {
	v, err := New(WithoutEndpoints())
	if err != nil {
		b.Fatal(err)
	}
	cs, _ := v.Client("c")
	ss, _ := v.Server("s")
	stop := interceptor.StopEvent{FullMethod: echoMethod, Attempts: 1, Reason: interceptor.StopBulkheadFull,
		Err: status.Error(codes.ResourceExhausted, "bulkhead full")}
	shed := server.Refusal{FullMethod: echoMethod, Reason: server.RefusalLimit, Criticality: wire.Critical,
		Err: status.Error(codes.ResourceExhausted, "over the limit")}
	ctx := context.Background()
	b.Run("client", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			cs.OnStop(ctx, stop)
		}
	})
	b.Run("client/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				cs.OnStop(ctx, stop)
			}
		})
	})
	b.Run("server", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ss.OnRefusal(ctx, shed)
		}
	})
	b.Run("server/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ss.OnRefusal(ctx, shed)
			}
		})
	})
}
