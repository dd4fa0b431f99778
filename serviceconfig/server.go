package serviceconfig

import "time"

// ConcurrencyLimit is a server's adaptive concurrency limit (see
// interceptor.WithConcurrencyLimit): how many requests may run at once,
// learned from their latencies within [MinLimit, MaxLimit]. The zero value
// is the Vegas limit with its defaults.
type ConcurrencyLimit struct {
	// Algorithm is "vegas" (the default, also for "") or "aimd".
	Algorithm string
	// InitialLimit is the limit before any request completed; 0 means 20
	// (clamped into [MinLimit, MaxLimit]).
	InitialLimit int
	// MinLimit is the least the limit falls to; 0 means 1.
	MinLimit int
	// MaxLimit is the most the limit grows to; 0 means 1000.
	MaxLimit int
	// BaseWindow is the period over which the base RTT (the service time
	// without queueing) is the least latency seen; the base RTT is the
	// minimum of the last two periods. 0 means 30s.
	BaseWindow time.Duration
}

// Validate reports the first field of c that is out of range.
func (c *ConcurrencyLimit) Validate() error {
	switch {
	case c.Algorithm != "" && c.Algorithm != "vegas" && c.Algorithm != "aimd":
		return newError("algorithm", `must be "vegas" or "aimd"`)
	case c.InitialLimit < 0:
		return newError("initialLimit", "must not be negative")
	case c.MinLimit < 0:
		return newError("minLimit", "must not be negative")
	case c.MaxLimit < 0:
		return newError("maxLimit", "must not be negative")
	case c.MaxLimit > 0 && c.MinLimit > c.MaxLimit:
		return newError("minLimit", "must not exceed maxLimit")
	case c.InitialLimit > 0 && c.MaxLimit > 0 && c.InitialLimit > c.MaxLimit:
		return newError("initialLimit", "must not exceed maxLimit")
	case c.InitialLimit > 0 && c.InitialLimit < c.MinLimit:
		return newError("initialLimit", "must not be less than minLimit")
	case c.MaxLimit == 0 && c.MinLimit > 1000:
		return newError("minLimit", "must not exceed maxLimit (default 1000)")
	case c.MaxLimit == 0 && c.InitialLimit > 1000:
		return newError("initialLimit", "must not exceed maxLimit (default 1000)")
	}
	return checkDuration("baseWindow", c.BaseWindow)
}
