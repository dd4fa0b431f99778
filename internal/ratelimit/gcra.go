package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Criticality orders calls for the burst's reserve, most important first
// in what it may take. The zero value is Critical, the default of a call
// that names none. The order and numbering are those of the server's
// overload protection (internal/limit), so one value maps to both.
type Criticality uint8

const (
	// Critical is the default: it may use the whole burst.
	Critical Criticality = iota
	// CriticalPlus may use the whole burst, as Critical: no reserve can
	// be kept above what the default criticality is configured to use.
	CriticalPlus
	// SheddablePlus is admitted while at least a quarter of the burst
	// above one token is left.
	SheddablePlus
	// Sheddable is admitted while at least half of the burst above one
	// token is left.
	Sheddable
	// NumCriticalities is the number of criticalities, for arrays indexed
	// by one.
	NumCriticalities
)

// valid is c, or Critical for a value out of range.
func (c Criticality) valid() Criticality {
	if c >= NumCriticalities {
		return Critical
	}
	return c
}

// BurstShare is the share of the burst above one token that a call of
// each criticality may take: a call is admitted only while the tokens left
// after it are at least (1 − BurstShare[c]) × (Burst − 1). So under a
// sustained excess, where the bucket never refills past a token or two,
// the less critical calls are refused while the critical ones still take
// every token that comes; a lone class of any criticality is still
// admitted at the full rate (it only sees a smaller burst).
var BurstShare = [NumCriticalities]float64{
	Critical:      1,
	CriticalPlus:  1,
	SheddablePlus: 0.75,
	Sheddable:     0.5,
}

// Defaults of Config.
const (
	// DefaultPer is the period of Config.Rate when Per is 0.
	DefaultPer = time.Second
	// DefaultMaxKeys is how many keys a Limiter remembers at once when
	// Config.MaxKeys is 0.
	DefaultMaxKeys = 10_000
)

// MaxKeyLen is the longest key a Limiter remembers, in bytes: longer keys
// share the overflow bucket, so that at most MaxKeys × MaxKeyLen bytes of
// key names are held whatever the callers send.
const MaxKeyLen = 256

// Config is one rate limit: Rate tokens per Per, with bursts of up to
// Burst tokens, one bucket per key.
type Config struct {
	// Rate is the number of calls admitted per Per, sustained; > 0. It
	// need not be whole: 0.5 per second is one call every 2 s.
	Rate float64
	// Per is the period of Rate; 0 means DefaultPer (one second).
	Per time.Duration
	// Burst is the number of calls admitted at once after a quiet
	// period; ≥ 1. A burst of 1 spaces calls evenly, one per Per/Rate.
	Burst int
	// MaxKeys bounds the keys remembered at once (see Limiter); 0 means
	// DefaultMaxKeys.
	MaxKeys int
}

// params are a Config normalised to integer nanoseconds.
type params struct {
	// t is the emission interval, Per/Rate rounded to the nanosecond
	// (at least 1): a token comes every t.
	t int64
	// tau is Burst·t: how far ahead of now the theoretical arrival time
	// may run after an admission by Critical.
	tau int64
	// room[c] is how far ahead of now the TAT may run after admitting a
	// call of criticality c: tau less c's reserve, (1 − BurstShare[c]) ×
	// (Burst − 1) × t, so never below t (the last token is everyone's).
	room [NumCriticalities]int64
}

// maxTau bounds Burst·t, so that TAT arithmetic near it cannot overflow:
// about 73 years.
const maxTau = 1 << 61

func (c Config) params() (params, error) {
	per := c.Per
	if per == 0 {
		per = DefaultPer
	}
	switch {
	case math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || c.Rate <= 0:
		return params{}, fmt.Errorf("ratelimit: Rate %v: must be a positive number", c.Rate)
	case per < 0:
		return params{}, fmt.Errorf("ratelimit: Per %v: must not be negative", c.Per)
	case c.Burst < 1:
		return params{}, fmt.Errorf("ratelimit: Burst %d: must be at least 1", c.Burst)
	case c.MaxKeys < 0:
		return params{}, fmt.Errorf("ratelimit: MaxKeys %d: must not be negative", c.MaxKeys)
	}
	tf := math.Round(float64(per) / c.Rate)
	if tf < 1 {
		return params{}, fmt.Errorf("ratelimit: Rate %v per %v: more than one call per nanosecond", c.Rate, per)
	}
	if tf > maxTau || int64(tf) > maxTau/int64(c.Burst) {
		return params{}, errors.New("ratelimit: Per/Rate × Burst: over 73 years")
	}
	p := params{t: int64(tf)}
	p.tau = p.t * int64(c.Burst)
	for cr := range NumCriticalities {
		reserve := int64(math.Round((1 - BurstShare[cr]) * float64(c.Burst-1) * float64(p.t)))
		p.room[cr] = p.tau - reserve
	}
	return p, nil
}

// take is GCRA for one call of criticality c at now, for a key whose
// theoretical arrival time is tat (all in nanoseconds on one time line):
// the call would move the TAT to next = max(tat, now) + t, and is admitted
// when next − now ≤ room[c] + maxWait, after a wait of next − now −
// room[c] (0 or less: at once). Refused, wait is the exact time from now
// until such a call would be admitted, if nothing else is admitted
// meanwhile.
func (p *params) take(tat, now int64, c Criticality, maxWait int64) (next, wait int64, ok bool) {
	next = max(tat, now) + p.t
	wait = next - now - p.room[c]
	return next, wait, wait <= maxWait
}
