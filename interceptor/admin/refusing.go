package admin

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

func ts(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// refusing lists the parts of view v, taken at now, that refuse calls now:
// open breakers (with the event that opened them), throttling adaptive
// throttles, ejected endpoints, unhealthy stores, and every part whose
// latest refusal is within recentWindow.
func (v *View) refusing(view *adminv1.View, now time.Time) []*adminv1.Refusing {
	var out []*adminv1.Refusing
	for _, c := range view.Clients {
		for _, m := range c.Methods {
			if b := m.Breaker; b != nil && refuses(b.State) {
				r := &adminv1.Refusing{Side: sideClient, Source: c.Name, Part: adminv1.Part_PART_BREAKER, Subject: m.FullMethod,
					Cause: "breaker " + b.State.Label()}
				if ev := v.events.latest(partKey{sideClient, c.Name, adminv1.Part_PART_BREAKER, m.FullMethod}, adminv1.EventKind_EVENT_KIND_BREAKER_STATE); ev != nil {
					r.Cause += ": " + ev.Cause
					r.Since, r.Sequence = ev.Time, ev.Sequence
				}
				out = append(out, r)
			}
			if a := m.Adaptive; a != nil && a.RejectProbability > 0 {
				out = append(out, &adminv1.Refusing{Side: sideClient, Source: c.Name, Part: adminv1.Part_PART_ADAPTIVE, Subject: m.FullMethod,
					Cause: fmt.Sprintf("adaptive throttling rejects %.0f%% of attempts locally: the backend accepted %.0f of %.0f in its window",
						100*a.RejectProbability, a.Accepts, a.Requests)})
			}
			if rl := m.RateLimit; rl != nil && rl.PacedUntil != nil {
				out = append(out, &adminv1.Refusing{Side: sideClient, Source: c.Name, Part: adminv1.Part_PART_RATE_LIMIT, Subject: m.FullMethod,
					Cause: fmt.Sprintf("paced by the server's pushback: one attempt per %v, next slot at %s; %d waiting",
						rl.Period.AsDuration(), rl.PacedUntil.AsTime().Format("15:04:05.000"), rl.Waiting)})
			}
		}
	}
	for _, ch := range view.Channels {
		for _, e := range ch.Endpoints {
			if e.EjectedUntil == nil {
				continue
			}
			subject := strings.Join(e.Addresses, ",") // as endpointWatch keys it
			r := &adminv1.Refusing{Side: sideChannel, Source: ch.Target, Part: adminv1.Part_PART_ENDPOINT, Subject: subject,
				Cause: e.Cause + "; until " + e.EjectedUntil.AsTime().Format("15:04:05.000")}
			if ev := v.events.latest(partKey{sideChannel, ch.Target, adminv1.Part_PART_ENDPOINT, subject}, adminv1.EventKind_EVENT_KIND_EJECTED); ev != nil {
				r.Since, r.Sequence = ev.Time, ev.Sequence
			}
			out = append(out, r)
		}
	}
	for _, s := range view.Servers {
		if st := s.Store; st != nil && !st.Healthy {
			out = append(out, &adminv1.Refusing{Side: sideServer, Source: s.Name, Part: adminv1.Part_PART_IDEMPOTENCY_STORE,
				Subject: "idempotency store", Cause: fmt.Sprintf("%d failures; the latest: %q", st.Failures, st.LastFailure),
				Since: st.LastFailureTime})
		}
	}
	return append(out, v.recentRefusals(now)...)
}

// recentRefusals returns, for each part, its latest episode of refusals
// when it is within recentWindow of now, oldest first.
func (v *View) recentRefusals(now time.Time) []*adminv1.Refusing {
	l := v.events
	l.mu.Lock()
	latest := map[partKey]*event{}
	for k, r := range l.parts {
		for i := range r.n {
			e := r.newest(i)
			if e.kind == adminv1.EventKind_EVENT_KIND_REFUSED || e.kind == adminv1.EventKind_EVENT_KIND_STORE_FAILED {
				if now.Sub(e.last) < recentWindow {
					latest[k] = e
				}
				break
			}
		}
	}
	es := make([]*event, 0, len(latest))
	for _, e := range latest {
		es = append(es, e)
	}
	sortBySeq(es)
	out := make([]*adminv1.Refusing, len(es))
	for i, e := range es {
		out[i] = &adminv1.Refusing{Side: e.key.side, Source: e.key.source, Part: e.key.part, Subject: e.key.subject,
			Cause: fmt.Sprintf("%s (%d refused, the latest at %s)", e.cause, e.count, e.last.Format("15:04:05.000")),
			Since: ts(e.time), Sequence: e.seq}
	}
	l.mu.Unlock()
	return out
}

// refuses reports whether a breaker in state s refuses calls.
func refuses(s adminv1.BreakerState) bool {
	switch s {
	case adminv1.BreakerState_BREAKER_STATE_OPEN, adminv1.BreakerState_BREAKER_STATE_HALF_OPEN, adminv1.BreakerState_BREAKER_STATE_FORCED_OPEN:
		return true
	}
	return false
}
