package server

import (
	"context"

	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// rank orders criticalities from the least critical (0) up.
func rank(c wire.Criticality) int {
	switch c {
	case wire.Sheddable:
		return 0
	case wire.SheddablePlus:
		return 1
	case wire.Critical:
		return 2
	}
	return 3
}

// incomingCriticality reads the criticality of an incoming call: the least
// critical of the valid values under wire.CriticalityKey; CRITICAL when
// there is none.
// It allocates only when the key is present (grpc copies the values).
func incomingCriticality(ctx context.Context) wire.Criticality {
	c, _ := sentCriticality(ctx)
	return c
}

// sentCriticality is incomingCriticality, and whether the call sent a
// valid value.
func sentCriticality(ctx context.Context) (c wire.Criticality, ok bool) {
	c = wire.Critical
	for _, v := range metadata.ValueFromIncomingContext(ctx, wire.CriticalityKey) {
		p, valid := wire.ParseCriticality(v)
		if valid && (!ok || rank(p) < rank(c)) {
			c, ok = p, true
		}
	}
	return c, ok
}

// CriticalityFunc decides the criticality a Server gives an incoming call
// (Limits.Criticality). sent is what the call carried under
// [wire.CriticalityKey] (the least critical valid value), and ok whether
// it carried one; sent is [wire.Critical] when ok is false. ctx is the
// call's context, with what the interceptors before the Server's put there
// (the peer, the credentials an authentication interceptor verified). It
// runs on every call under an overload protection, synchronously, and must
// be cheap and safe for concurrent use. A result that is not one of the
// four criticalities counts as [wire.Critical].
type CriticalityFunc func(ctx context.Context, sent wire.Criticality, ok bool) wire.Criticality

// CapCriticality returns a CriticalityFunc that gives each call the
// criticality it sent (CRITICAL when it sent none), but at most highest: a
// call that sent, or defaulted to, a more critical value gets highest.
// CapCriticality(wire.CriticalPlus) trusts every caller's claim.
func CapCriticality(highest wire.Criticality) CriticalityFunc {
	return func(_ context.Context, sent wire.Criticality, _ bool) wire.Criticality {
		if rank(sent) > rank(highest) {
			return highest
		}
		return sent
	}
}

// criticality resolves the criticality of an incoming call: through
// Limits.Criticality, or by default as sent but at most CRITICAL; always one
// of the four.
func (ls *srvLimits) criticality(ctx context.Context) wire.Criticality {
	return resolveCriticality(ls.crit, ctx)
}

// resolveCriticality is the criticality of a call on ctx under crit
// (Limits.Criticality; nil: as sent, at most Critical).
func resolveCriticality(crit CriticalityFunc, ctx context.Context) wire.Criticality {
	c, ok := sentCriticality(ctx)
	if crit == nil {
		if c == wire.CriticalPlus {
			c = wire.Critical
		}
		return c
	}
	c = crit(ctx, c, ok)
	if c > wire.Sheddable {
		c = wire.Critical
	}
	return c
}
