package admin

import (
	"fmt"
	"strings"
	"sync"
	"time"

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
// policy has no hook for its ejections (the endpoint round-2 issue adds a
// logger for them), so the view reads endpoint.Snapshots when it is asked
// (a snapshot, a page, a watcher's poll) and records an ejection or a
// return it had not seen: an ejection that began and ended between two
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
			AttemptsAvoided: s.AttemptsAvoided}
		for _, e := range s.Endpoints {
			pe := &adminv1.Endpoint{Addresses: e.Addresses, Connectivity: e.Connectivity.String(), Ejections: e.Ejections,
				ConsecutiveFailures: int64(e.ConsecutiveFailures), Calls: int64(e.Calls), Failures: int64(e.Failures)}
			k := endpointKey{target: s.Target, addrs: strings.Join(e.Addresses, ",")}
			live[k] = true
			ejected := !e.EjectedUntil.IsZero()
			if ejected {
				pe.EjectedUntil = ts(e.EjectedUntil)
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
		prev.cause, prev.since = ejectionCause(e), now
		w.events.add(&event{key: key, kind: adminv1.EventKind_EVENT_KIND_EJECTED, cause: prev.cause,
			to: "until " + e.EjectedUntil.Format("15:04:05.000"), until: e.EjectedUntil})
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

// ejectionCause says why an ejected endpoint is out: its failures, as
// the policy counts them until it returns.
func ejectionCause(e endpoint.EndpointState) string {
	return fmt.Sprintf("ejected (ejection %d) after %d failures in a row; %d of %d attempts failed in the window",
		e.Ejections, e.ConsecutiveFailures, e.Failures, e.Calls)
}
