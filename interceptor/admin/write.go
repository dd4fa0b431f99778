package admin

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// The write actions, as Write.Action names them.
const (
	ActionForceOpen   = "force_open"
	ActionForceClosed = "force_closed"
	ActionReset       = "reset"
)

// actionOf maps the proto's action to its name; "" for none.
func actionOf(a adminv1.BreakerAction) string {
	switch a {
	case adminv1.BreakerAction_BREAKER_ACTION_FORCE_OPEN:
		return ActionForceOpen
	case adminv1.BreakerAction_BREAKER_ACTION_FORCE_CLOSED:
		return ActionForceClosed
	case adminv1.BreakerAction_BREAKER_ACTION_RESET:
		return ActionReset
	}
	return ""
}

// errWritesOff refuses a write on a View without WithWrites.
var errWritesOff = status.Error(codes.PermissionDenied,
	"admin: write actions are off: the process did not give an authorization hook (admin.WithWrites)")

// write runs the write action w, as the caller who (a peer address)
// asked: refused unless the View has an Authorizer and it allows w. Every
// write asked is logged and recorded as an event, allowed or not. The
// error is a gRPC status.
func (v *View) write(ctx context.Context, w Write, who string) (*adminv1.Breaker, error) {
	b, err := v.runWrite(ctx, w)
	outcome := "done"
	level := slog.LevelInfo
	if err != nil {
		outcome, level = "refused: "+status.Convert(err).Message(), slog.LevelWarn
	}
	v.opts.logger.LogAttrs(ctx, level, "admin: write action", slog.String("action", w.Action),
		slog.String("client", w.Client), slog.String("method", w.FullMethod), slog.String("by", who),
		slog.String("outcome", outcome))
	v.events.add(&event{key: partKey{side: sideClient, source: w.Client, part: adminv1.Part_PART_ADMIN, subject: w.FullMethod},
		kind: adminv1.EventKind_EVENT_KIND_WRITE, reason: w.Action,
		cause: fmt.Sprintf("%s of %s's breaker asked by %s: %s", w.Action, w.FullMethod, who, outcome)})
	return b, err
}

func (v *View) runWrite(ctx context.Context, w Write) (*adminv1.Breaker, error) {
	if v.opts.authorize == nil {
		return nil, errWritesOff
	}
	if w.Action == "" {
		return nil, status.Error(codes.InvalidArgument, "admin: no action: want force_open, force_closed or reset")
	}
	if err := v.opts.authorize(ctx, w); err != nil {
		return nil, status.Error(codes.PermissionDenied, "admin: not authorized: "+err.Error())
	}
	src := v.client(w.Client)
	var c *interceptor.Client
	if src != nil {
		c = src.c.Load()
	}
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "admin: client %q: %v", w.Client, errNoClient)
	}
	var err error
	switch w.Action {
	case ActionForceOpen:
		err = c.ForceOpen(w.FullMethod)
	case ActionForceClosed:
		err = c.ForceClosed(w.FullMethod)
	case ActionReset:
		err = c.ResetBreaker(w.FullMethod)
	default:
		return nil, status.Errorf(codes.InvalidArgument, "admin: action %q: want force_open, force_closed or reset", w.Action)
	}
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if b := c.Status(w.FullMethod).Breaker; b != nil {
		return breakerProto(b), nil
	}
	return nil, status.Error(codes.Internal, "admin: the breaker is gone after the action")
}

// peerOf names the gRPC caller of ctx by its address.
func peerOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return "unknown peer"
}
