package adminv1

// This file is written by hand (buf generate leaves it be): the names the
// admin page (interceptor/admin) and cmd/resadmin show for the enums, so
// that the two say the same, and the command needs nothing of the library
// but this package.

import "strings"

// Label returns the part as an operator reads it, lower case with spaces:
// "breaker", "retry budget", "idempotency store"; "other" for
// PART_UNSPECIFIED, the part of the refusals of a reason the view does not
// know.
func (p Part) Label() string {
	if p == Part_PART_UNSPECIFIED {
		return "other"
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(p.String(), "PART_")), "_", " ")
}

// Label returns the state as the Client names it (interceptor.BreakerState):
// "closed", "open", "half-open", "forced-open" or "forced-closed";
// "unknown" for another value.
func (s BreakerState) Label() string {
	if _, ok := BreakerState_name[int32(s)]; !ok || s == BreakerState_BREAKER_STATE_UNSPECIFIED {
		return "unknown"
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "BREAKER_STATE_")), "_", "-")
}

// Label returns the kind of event in a word or two: "state" (a breaker's
// change of state), "refused", "ejected", "returned", "store failed" or
// "write"; "unknown" for another value.
func (k EventKind) Label() string {
	switch k {
	case EventKind_EVENT_KIND_BREAKER_STATE:
		return "state"
	case EventKind_EVENT_KIND_REFUSED:
		return "refused"
	case EventKind_EVENT_KIND_EJECTED:
		return "ejected"
	case EventKind_EVENT_KIND_RETURNED:
		return "returned"
	case EventKind_EVENT_KIND_STORE_FAILED:
		return "store failed"
	case EventKind_EVENT_KIND_WRITE:
		return "write"
	}
	return "unknown"
}
