// Package backoff computes retry delays: exponential growth with a cap, and a
// choice of jitter.
//
// With n the number of retries since the last reset (0 for the first retry),
// the exponential delay is
//
//	d(n) = min(Initial × Multiplier^n, Max)
//
// and the jitters, with r uniform in [0, 1), are
//
//	A6            d × (0.8 + 0.4r)                     within ±20% of d (gRFC A6)
//	Full          d × r                                in [0, d)
//	Equal         d/2 + d/2 × r                        in [d/2, d)
//	Decorrelated  min(Max, Initial + r × (3p − Initial)) in [Initial, 3p); p is the
//	              previous delay, Initial at first; Multiplier is not used
//	None          d
//
// The functions are pure: randomness comes in as r, and the caller keeps the
// previous delay, so tests pin every formula at its bounds. A6 jitter may
// exceed Max by up to 20%, as gRFC A6 and grpc-go allow.
package backoff
