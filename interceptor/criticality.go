package interceptor

import (
	"context"
	"strconv"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/internal/limit"
)

// CriticalityKey is the metadata key that carries a request's criticality:
// one of CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS, SHEDDABLE. A server with
// a concurrency limit (WithConcurrencyLimit) sheds the lowest first.
//
// The value is the caller's claim: a server reads it as untrusted input.
// Names are matched without regard to case; a value that is none of the
// four names is ignored; when the key has several values, the least
// critical one counts, so that a value added on the way (such as the
// client's own SHEDDABLE_PLUS on retries) can lower a criticality but never
// raise it. A request without a valid value is CRITICAL.
const CriticalityKey = "resilience-criticality"

// Criticality orders requests for load shedding. The zero value is
// Critical, the default.
type Criticality uint8

const (
	// Critical is the default: shed only when the requests in flight fill
	// 90% of the limit.
	Critical Criticality = Criticality(limit.Critical)
	// CriticalPlus is shed last: it may fill the whole limit.
	CriticalPlus Criticality = Criticality(limit.CriticalPlus)
	// SheddablePlus is shed when the requests in flight fill 75% of the
	// limit. A client sends its retries and hedged copies as
	// SheddablePlus at most.
	SheddablePlus Criticality = Criticality(limit.SheddablePlus)
	// Sheddable is shed first, when the requests in flight fill half of
	// the limit.
	Sheddable Criticality = Criticality(limit.Sheddable)
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

// rank orders criticalities from the least critical (0) up.
func (c Criticality) rank() int {
	switch c {
	case Sheddable:
		return 0
	case SheddablePlus:
		return 1
	case Critical:
		return 2
	}
	return 3
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
// Client sends the retries and hedged copies of such a call as
// SheddablePlus at most (Sheddable stays Sheddable), so that under
// pressure a retry never displaces a first attempt of equal rank.
func ContextWithCriticality(ctx context.Context, c Criticality) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(CriticalityKey, c.String())
	return metadata.NewOutgoingContext(ctx, md)
}

// incomingCriticality reads the criticality of an incoming call: the least
// critical of the valid values under CriticalityKey, Critical when none.
// It allocates only when the key is present (grpc copies the values).
func incomingCriticality(ctx context.Context) Criticality {
	c, _ := sentCriticality(ctx)
	return c
}

// sentCriticality is incomingCriticality, and whether the call sent a
// valid value.
func sentCriticality(ctx context.Context) (c Criticality, ok bool) {
	c = Critical
	for _, v := range metadata.ValueFromIncomingContext(ctx, CriticalityKey) {
		p, valid := ParseCriticality(v)
		if valid && (!ok || p.rank() < c.rank()) {
			c, ok = p, true
		}
	}
	return c, ok
}

// CriticalityFunc decides the criticality a Server gives an incoming call
// (WithCriticality). sent is what the call carried under CriticalityKey
// (the least critical valid value), and ok whether it carried one; sent
// is Critical when ok is false. ctx is the call's context, with what the
// interceptors before the Server's put there (the peer, the credentials an
// authentication interceptor verified). It runs on every call under an
// overload protection, synchronously, and must be cheap and safe for
// concurrent use. A result that is not one of the four criticalities
// counts as Critical.
type CriticalityFunc func(ctx context.Context, sent Criticality, ok bool) Criticality

// WithCriticality makes the Server's overload protection (WithConcurrencyLimit,
// WithMethodConcurrencyLimit, WithCPUShedding) shed calls by the
// criticality f returns instead of the one they sent.
//
// The threat: CriticalityKey is set by the caller, so a caller trusted with
// CRITICAL_PLUS can send it with every call and be shed last, taking the
// share of the limit kept for the truly critical calls (and making every
// other caller yield), and every caller that does so makes the levels
// meaningless. So without this option the Server takes a call's
// criticality as sent but at most Critical, the default: anyone may lower
// their own, no one may raise it (CapCriticality(Critical)). To let
// callers you trust claim CRITICAL_PLUS, decide by who they are: a
// CriticalityFunc can let authenticated internal callers through as sent
// and cap the rest; WithCriticality(CapCriticality(CriticalPlus)) trusts
// every caller.
func WithCriticality(f CriticalityFunc) ServerOption {
	return srvOptionFunc(func(o *serverOptions) {
		if f == nil {
			o.errs = append(o.errs, errorf("WithCriticality: nil function"))
			return
		}
		o.criticality = f
	})
}

// CapCriticality returns a CriticalityFunc that gives each call the
// criticality it sent (Critical when it sent none), but at most highest: a
// call that sent, or defaulted to, a more critical value gets highest.
func CapCriticality(highest Criticality) CriticalityFunc {
	return func(_ context.Context, sent Criticality, _ bool) Criticality {
		if sent.rank() > highest.rank() {
			return highest
		}
		return sent
	}
}

// criticality resolves the criticality of an incoming call: through
// WithCriticality's function, or by default as sent but at most Critical;
// always one of the four.
func (ls *srvLimits) criticality(ctx context.Context) Criticality {
	c, ok := sentCriticality(ctx)
	if ls.crit == nil {
		if c == CriticalPlus {
			c = Critical
		}
		return c
	}
	c = ls.crit(ctx, c, ok)
	if int(c) >= len(criticalityNames) {
		c = Critical
	}
	return c
}
