package serviceconfig

import "time"

// ClientRateLimit is a client's rateLimit block for the methods of its
// entry (an extension block): it paces the method's attempts while the
// server pushes back, and, when Rate is set, limits the attempts the
// client sends, so that a downstream it does not own, or a paid quota, is
// never asked for more. Each selected method has a limit of its own.
//
// Pacing: after an attempt that the server refused with
// RESOURCE_EXHAUSTED and a wait (a google.rpc.RetryInfo detail, or the
// grpc-retry-pushback-ms trailer), the method's attempts go one per that
// wait, rather than each sending a doomed attempt; each admitted attempt
// halves the spacing, until the pacing ends under a millisecond;
// a retry of the refused call waits for its slot, within the call's
// deadline and the retry budget. The server's wait is capped by the
// client's WithMaxServerPushback (30s by default).
//
// An attempt that would wait for its token or its slot longer than MaxWait,
// or past the call's deadline, fails at once, locally, with
// RESOURCE_EXHAUSTED and a RetryInfo saying when it could go: it never
// reaches the server and never counts as a failure of the method (no
// breaker, no adaptive throttle). An attempt never starts a wait its
// deadline cannot cover.
type ClientRateLimit struct {
	// Rate, when set, is the number of attempts the client sends per Per,
	// sustained; > 0. Every attempt counts: first attempts, retries and
	// hedged copies. 0 leaves the rate to the server: pacing only.
	Rate float64
	// Per is the period of Rate; 0 means one second. Needs Rate.
	Per time.Duration
	// Burst is the number of attempts sent at once after a quiet period;
	// at least 1 when Rate is set (1 spaces attempts evenly, one per
	// Per/Rate). Needs Rate.
	Burst int
	// MaxWait bounds how long an attempt may wait for its token or its
	// slot, and never past the call's deadline; 0 means none waits: an
	// attempt that cannot go at once fails at once.
	MaxWait time.Duration
}

// Validate reports the first field of r that is out of range, with its
// JSON path.
func (r *ClientRateLimit) Validate() error {
	switch {
	case !finite(r.Rate) || r.Rate < 0:
		return newError("rate", "must be a positive number of attempts per period")
	case r.Per < 0:
		return newError("per", "must not be negative")
	case r.Rate == 0 && r.Per != 0:
		return newError("per", "needs rate: without a rate, the block only paces the method as the server says")
	case r.Rate == 0 && r.Burst != 0:
		return newError("burst", "needs rate: without a rate, the block only paces the method as the server says")
	case r.Rate > 0 && r.Burst < 1:
		return newError("burst", "must be at least 1 (the attempts sent at once; 1 spaces them evenly)")
	case r.MaxWait < 0:
		return newError("maxWait", "must not be negative")
	}
	if r.Rate == 0 {
		return nil
	}
	per := r.Per
	if per == 0 {
		per = time.Second
	}
	t := float64(per) / r.Rate
	switch {
	case t < 1:
		return newError("rate", "more than one attempt per nanosecond")
	case t*float64(r.Burst) > 1<<61:
		return newError("burst", "burst × per/rate is over 73 years")
	}
	return nil
}

// wireClientRateLimit is the JSON of a ClientRateLimit.
type wireClientRateLimit struct {
	Rate    leaf[*float64]
	Per     leaf[*duration]
	Burst   leaf[*int]
	MaxWait leaf[*duration]
}

// check returns the first leaf of w that failed to decode, with its path
// under p.
func (w *wireClientRateLimit) check(p string) error {
	return checkAll(p,
		field{"rate", &w.Rate},
		field{"per", &w.Per},
		field{"burst", &w.Burst},
		field{"maxWait", &w.MaxWait},
	)
}

// limit returns the block w holds. A rate or burst written out must be in
// range: a 0 written out cannot mean "no limit" (left out, the block
// paces only).
func (w *wireClientRateLimit) limit() (*ClientRateLimit, error) {
	r := &ClientRateLimit{Per: optDuration(w.Per.v), MaxWait: optDuration(w.MaxWait.v)}
	if v := w.Rate.v; v != nil {
		if !(*v > 0) {
			return nil, newError("rate", "must be a positive number of attempts per period (leave it out to pace only)")
		}
		r.Rate = *v
	}
	if v := w.Burst.v; v != nil {
		if *v < 1 {
			return nil, newError("burst", "must be at least 1 (the attempts sent at once; 1 spaces them evenly)")
		}
		r.Burst = *v
	}
	return r, nil
}

// jsonClientRateLimit is the JSON MarshalJSON writes for a ClientRateLimit.
type jsonClientRateLimit struct {
	Rate    float64      `json:"rate,omitempty"`
	Per     jsonDuration `json:"per,omitempty"`
	Burst   int          `json:"burst,omitempty"`
	MaxWait jsonDuration `json:"maxWait,omitempty"`
}
