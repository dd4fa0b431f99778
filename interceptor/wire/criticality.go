package wire

import (
	"context"
	"strconv"
	"strings"

	"google.golang.org/grpc/metadata"
)

// CriticalityKey is the metadata key that carries a request's criticality:
// one of CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS, SHEDDABLE. A server of
// package interceptor/server under overload protection (server.WithLimits)
// sheds the least critical first.
//
// The value is the caller's claim: a server reads it as untrusted input.
// Names are matched without regard to case; a value that is none of the
// four names is ignored; when the key has several values, the least
// critical one counts, so that a value added on the way (such as the
// client's own SHEDDABLE_PLUS on retries) can lower a criticality but never
// raise it. A request without a valid value is CRITICAL. By default the
// server also caps what a caller claims at CRITICAL (server.Limits.Criticality
// decides whom to trust with CRITICAL_PLUS).
const CriticalityKey = "resilience-criticality"

// Criticality orders requests for load shedding. The zero value is
// Critical, the default.
type Criticality uint8

const (
	// Critical is the default: shed only when the requests in flight fill
	// 90% of the limit.
	Critical Criticality = iota
	// CriticalPlus is shed last: it may fill the whole limit.
	CriticalPlus
	// SheddablePlus is shed when the requests in flight fill 75% of the
	// limit. A client sends its retries and hedged copies as
	// SheddablePlus at most.
	SheddablePlus
	// Sheddable is shed first, when the requests in flight fill half of
	// the limit.
	Sheddable
)

// criticalityNames are the wire names, indexed by Criticality.
var criticalityNames = [...]string{
	Critical:      "CRITICAL",
	CriticalPlus:  "CRITICAL_PLUS",
	SheddablePlus: "SHEDDABLE_PLUS",
	Sheddable:     "SHEDDABLE",
}

// String returns the wire name, such as "SHEDDABLE_PLUS".
func (c Criticality) String() string {
	if int(c) < len(criticalityNames) {
		return criticalityNames[c]
	}
	return "Criticality(" + strconv.Itoa(int(c)) + ")"
}

// ParseCriticality reads a wire name, without regard to case.
func ParseCriticality(s string) (Criticality, bool) {
	for c, n := range criticalityNames {
		if strings.EqualFold(s, n) {
			return Criticality(c), true
		}
	}
	return Critical, false
}

// ContextWithCriticality returns ctx whose outgoing calls carry criticality
// c under CriticalityKey, in place of any criticality ctx carried. A
// Client of package interceptor sends the retries and hedged copies of such
// a call as
// SheddablePlus at most (Sheddable stays Sheddable), so that under
// pressure a retry never displaces a first attempt of equal rank.
func ContextWithCriticality(ctx context.Context, c Criticality) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(CriticalityKey, c.String())
	return metadata.NewOutgoingContext(ctx, md)
}
