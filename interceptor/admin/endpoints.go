package admin

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// The sides of the view, as events name them.
const (
	sideClient  = "client"
	sideServer  = "server"
	sideChannel = "channel"
)

// maxEndpoints bounds the endpoints whose ejection state the view
// remembers between two looks.
const maxEndpoints = 4096

// endpointKey names one endpoint of one channel.
type endpointKey struct{ target, addrs string }

// seenEndpoint is what the view saw of an endpoint at its last look.
type seenEndpoint struct {
	ejections uint64
	ejected   bool
	cause     string
	since     time.Time
}

// endpointWatch turns the endpoint policy's snapshots into events. The
// policy reports its ejections to a process-wide logger
// (endpoint.SetLogger), which is the user's, not a hook the view may
// take; so the view reads endpoint.Snapshots when it is asked (a
// snapshot, a page, a watcher's poll) and records an ejection or a return
// it had not seen, an ejection stamped with when the policy ejected the
// endpoint (EjectedSince). An ejection that began and ended between two
// looks shows in the endpoint's count of ejections, not as an event.
type endpointWatch struct {
	events *eventLog
	// snapshots returns the channels' states at now: endpoint.Snapshots,
	// or a test's.
	snapshots func(now time.Time) []endpoint.Snapshot

	mu   sync.Mutex
	seen map[endpointKey]*seenEndpoint
}

func newEndpointWatch(events *eventLog) *endpointWatch {
	return &endpointWatch{events: events, snapshots: endpoint.Snapshots, seen: map[endpointKey]*seenEndpoint{}}
}

// poll reads the channels at now, records the ejections and returns seen
// since the last look, and returns the channels.
func (w *endpointWatch) poll(now time.Time) []*adminv1.Channel {
	snaps := w.snapshots(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	live := make(map[endpointKey]bool, len(w.seen))
	out := make([]*adminv1.Channel, 0, len(snaps))
	for _, s := range snaps {
		ch := &adminv1.Channel{Target: s.Target, ChildPolicy: s.ChildPolicy, Ejections: s.Ejections, Overflow: s.Overflow,
			AttemptsAvoided: s.AttemptsAvoided, Returns: s.Returns, Idle: s.Idle}
		if s.EndpointConcurrency > 0 { // peak_ewma's settings in effect
			ch.DecayTime, ch.EndpointConcurrency = durationpb.New(s.DecayTime), int64(s.EndpointConcurrency)
		}
		for _, e := range s.Endpoints {
			pe := &adminv1.Endpoint{Addresses: e.Addresses, Connectivity: e.Connectivity.String(), Ejections: e.Ejections,
				ConsecutiveFailures: int64(e.ConsecutiveFailures), Calls: int64(e.Calls), Failures: int64(e.Failures),
				EjectionCause: e.Cause, Multiplier: int64(e.Multiplier), Probation: e.Probation,
				ConsecutiveLocalFailures: int64(e.ConsecutiveLocalFailures), Outstanding: int64(e.Outstanding)}
			if e.Latency > 0 {
				pe.Latency = durationpb.New(e.Latency)
			}
			k := endpointKey{target: s.Target, addrs: strings.Join(e.Addresses, ",")}
			live[k] = true
			ejected := !e.EjectedUntil.IsZero()
			if ejected {
				pe.EjectedUntil = ts(e.EjectedUntil)
				if !e.EjectedSince.IsZero() {
					pe.EjectedSince = ts(e.EjectedSince)
				}
			}
			pe.Cause = w.noteLocked(k, e, ejected, now)
			ch.Endpoints = append(ch.Endpoints, pe)
		}
		out = append(out, ch)
	}
	for k := range w.seen { // channels and endpoints gone: forget them
		if !live[k] {
			delete(w.seen, k)
		}
	}
	return out
}

// noteLocked compares endpoint e of key k with the last look, records an
// ejection or return, and returns the cause of its ejection ("" in
// rotation).
func (w *endpointWatch) noteLocked(k endpointKey, e endpoint.EndpointState, ejected bool, now time.Time) string {
	prev := w.seen[k]
	if prev == nil {
		if len(w.seen) >= maxEndpoints {
			if ejected {
				return ejectionCause(e)
			}
			return ""
		}
		prev = &seenEndpoint{}
		w.seen[k] = prev
		// A first look at an endpoint ejected already is an ejection the
		// view had not seen; one in rotation is no event.
	}
	key := partKey{side: sideChannel, source: k.target, part: adminv1.Part_PART_ENDPOINT, subject: k.addrs}
	switch {
	case ejected && (!prev.ejected || e.Ejections > prev.ejections):
		// The event is stamped with when the policy ejected the endpoint,
		// which may be before the view looked.
		at := e.EjectedSince
		if at.IsZero() || at.After(now) {
			at = now
		}
		prev.cause, prev.since = ejectionCause(e), at
		w.events.addAt(&event{key: key, kind: adminv1.EventKind_EVENT_KIND_EJECTED, cause: prev.cause,
			to: "until " + e.EjectedUntil.Format("15:04:05.000"), until: e.EjectedUntil}, at)
	case !ejected && prev.ejected:
		w.events.add(&event{key: key, kind: adminv1.EventKind_EVENT_KIND_RETURNED, cause: "ejection time ended: back in rotation"})
		prev.cause = ""
	}
	prev.ejected, prev.ejections = ejected, e.Ejections
	if ejected && prev.cause == "" {
		prev.cause = ejectionCause(e)
	}
	return prev.cause
}

// ejectionCause says why an ejected endpoint is out: the policy's cause
// and its failures, as the policy counts them until it returns.
func ejectionCause(e endpoint.EndpointState) string {
	var why string
	switch e.Cause {
	case "consecutive_failures":
		why = fmt.Sprintf("after %d failures in a row", e.ConsecutiveFailures)
	case "failure_rate":
		why = "for its failure rate"
	case "local_origin":
		why = fmt.Sprintf("after %d local-origin failures in a row (connections refused or reset before an answer)", e.ConsecutiveLocalFailures)
	case "probation":
		why = "failed again on probation, back from its last ejection"
	default:
		why = fmt.Sprintf("after %d failures in a row", e.ConsecutiveFailures)
	}
	length := ""
	if e.Multiplier > 1 {
		length = fmt.Sprintf(", %d× the base ejection time", e.Multiplier)
	}
	return fmt.Sprintf("ejected (ejection %d%s) %s; %d of %d attempts failed in the window", e.Ejections, length, why, e.Failures, e.Calls)
}
