package admin

import (
	"context"
	"time"

	"google.golang.org/grpc"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// Register registers v's admin service (resilience.admin.v1.AdminService)
// on s, as grpc-go's admin.Register registers channelz and CSDS: the view,
// the events, a stream of the events as they happen, and the breaker
// actions, which are refused unless v has WithWrites. Serve it on a port
// your operators reach and your users do not, or behind the same
// authentication as your other admin services: the view names your
// methods, tenants and backends.
func Register(s grpc.ServiceRegistrar, v *View) {
	adminv1.RegisterAdminServiceServer(s, &service{v: v})
}

// service is the gRPC face of a View.
type service struct {
	adminv1.UnimplementedAdminServiceServer
	v *View
}

func (s *service) GetView(context.Context, *adminv1.GetViewRequest) (*adminv1.GetViewResponse, error) {
	return &adminv1.GetViewResponse{View: s.v.Snapshot()}, nil
}

func (s *service) ListEvents(_ context.Context, req *adminv1.ListEventsRequest) (*adminv1.ListEventsResponse, error) {
	s.v.pollEndpoints()
	events, dropped := s.v.Events(req.GetAfterSequence(), int(req.GetMaxEvents()))
	return &adminv1.ListEventsResponse{Events: events, Dropped: dropped}, nil
}

func (s *service) ControlBreaker(ctx context.Context, req *adminv1.ControlBreakerRequest) (*adminv1.ControlBreakerResponse, error) {
	b, err := s.v.write(ctx, Write{Action: actionOf(req.GetAction()), Client: req.GetClient(), FullMethod: req.GetFullMethod()}, peerOf(ctx))
	if err != nil {
		return nil, err
	}
	return &adminv1.ControlBreakerResponse{Breaker: b}, nil
}

func (s *service) WatchEvents(req *adminv1.WatchEventsRequest, stream grpc.ServerStreamingServer[adminv1.WatchEventsResponse]) error {
	return s.v.watch(stream.Context(), req.AfterSequence, func(e *adminv1.Event) error {
		return stream.Send(&adminv1.WatchEventsResponse{Event: e})
	})
}

// The pace of a watch: it looks at the endpoints every endpointPoll (the
// policy has no hook), and sends what changed at most every watchPace, so
// that a flood of refusals, each growing its episode's count, costs a
// watcher one look per watchPace rather than one per refusal.
const (
	endpointPoll = 250 * time.Millisecond
	watchPace    = 50 * time.Millisecond
)

// pollEndpoints looks at the endpoints, recording their ejections and
// returns, when the view shows them.
func (v *View) pollEndpoints() {
	if v.opts.endpoints {
		v.eps.poll(v.opts.now())
	}
}

// watch calls send with the events after sequence *after (none when
// after is nil), then with each event that is new or whose count grew,
// until ctx ends or send fails.
func (v *View) watch(ctx context.Context, after *uint64, send func(*adminv1.Event) error) error {
	v.pollEndpoints()
	backlog, ver, next := v.events.backlog(after)
	for _, e := range backlog {
		if err := send(e); err != nil {
			return err
		}
	}
	var poll <-chan time.Time
	if v.opts.endpoints {
		t := time.NewTicker(endpointPoll)
		defer t.Stop()
		poll = t.C
	}
	pace := time.NewTimer(0)
	defer pace.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-poll:
			v.pollEndpoints()
			continue
		case <-next:
		}
		select { // at most one look per watchPace
		case <-ctx.Done():
			return nil
		case <-pace.C:
		}
		var events []*adminv1.Event
		events, ver, next = v.events.changes(ver)
		for _, e := range events {
			if err := send(e); err != nil {
				return err
			}
		}
		pace.Reset(watchPace)
	}
}
