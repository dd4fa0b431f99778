package limit

import (
	"errors"
	"math"
	"sync"
	"time"
)

// BBRConfig is the normalized configuration of a [BBR] shedder. Zero
// fields take their defaults.
type BBRConfig struct {
	// CPUThreshold is the CPU use, in (0, 1], above which the shedder
	// limits the requests in flight; 0 means 0.8.
	CPUThreshold float64
	// Window is the length over which the pass rate and the minimum RTT
	// are measured, in 10 buckets; 0 means 5s.
	Window time.Duration
	// CoolOff is how long, after a request was shed, the shedder keeps
	// limiting even when the CPU use fell below the threshold; 0 means 1s.
	CoolOff time.Duration
}

const bbrBuckets = 10

// Validate reports the first field of c out of range.
func (c BBRConfig) Validate() error {
	switch {
	case !(c.CPUThreshold >= 0 && c.CPUThreshold <= 1):
		return errors.New("limit: cpuThreshold must be between 0 and 1")
	case c.Window < 0 || c.Window > 0 && c.Window < bbrBuckets*time.Millisecond:
		return errors.New("limit: window must be at least 10ms")
	case c.CoolOff < 0:
		return errors.New("limit: coolOff must not be negative")
	}
	return nil
}

// A BBR sheds load as Kratos' and go-zero's BBR-inspired limiters do: while
// the CPU use is above CPUThreshold (or within CoolOff of the last shed),
// a request is admitted only while the requests in flight stay below the
// estimated bandwidth-delay product of the server,
//
//	maxInFlight = maxPass × minRT / bucket
//
// where maxPass is the most requests completed in one bucket of the window
// and minRT the least mean latency of a bucket, each over the window (the
// current bucket excluded, as it is incomplete). Below the threshold every
// request is admitted, so an idle server never sheds. Criticalities take
// the same shares of maxInFlight as of a concurrency limit. A BBR is safe
// for concurrent use.
type BBR struct {
	cfg    BBRConfig     // normalized; immutable
	bucket time.Duration // Window / 10; immutable

	mu       sync.Mutex
	inflight int
	b        [bbrBuckets]bbrBucket
	head     int       // the current bucket
	start    time.Time // of the current bucket; zero before the first call
	lastShed time.Time // zero: none
	srtt     float64   // EWMA of admitted latencies, for pushback
	shedEW   float64   // EWMA of the shed share, for pushback
	count    [NumVerdicts][NumCriticalities]uint64
}

type bbrBucket struct {
	pass  int           // requests completed
	rtSum time.Duration // of their latencies
}

// NewBBR returns a BBR for cfg, or cfg's error.
func NewBBR(cfg BBRConfig) (*BBR, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.CPUThreshold == 0 {
		cfg.CPUThreshold = 0.8
	}
	if cfg.Window == 0 {
		cfg.Window = 5 * time.Second
	}
	if cfg.CoolOff == 0 {
		cfg.CoolOff = time.Second
	}
	return &BBR{cfg: cfg, bucket: cfg.Window / bbrBuckets}, nil
}

// rotate moves the buckets to now.
func (s *BBR) rotate(now time.Time) {
	if s.start.IsZero() {
		s.start = now
		return
	}
	n := int64(now.Sub(s.start) / s.bucket)
	if n <= 0 {
		return
	}
	for i := int64(0); i < min(n, bbrBuckets); i++ {
		s.head = (s.head + 1) % bbrBuckets
		s.b[s.head] = bbrBucket{}
	}
	s.start = s.start.Add(time.Duration(n) * s.bucket)
}

// maxInFlightLocked is the bandwidth-delay product; 0 when the window has
// no complete bucket with a request yet.
func (s *BBR) maxInFlightLocked() float64 {
	maxPass, minRT := 0, time.Duration(math.MaxInt64)
	for i, b := range s.b {
		if i == s.head || b.pass == 0 {
			continue
		}
		maxPass = max(maxPass, b.pass)
		minRT = min(minRT, b.rtSum/time.Duration(b.pass))
	}
	if maxPass == 0 {
		return 0
	}
	return float64(maxPass) * float64(minRT) / float64(s.bucket)
}

// Acquire decides on a request of criticality c at now, with the CPU use
// cpu in [0, 1]. An admitted request must be ended by one Release or
// Abandon. A shed request gets the pushback of a concurrency limit (see
// the package doc), or NoRetry.
func (s *BBR) Acquire(now time.Time, cpu float64, c Criticality) (Verdict, time.Duration) {
	if c >= NumCriticalities {
		c = Critical
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rotate(now)
	hot := cpu >= s.cfg.CPUThreshold || !s.lastShed.IsZero() && now.Sub(s.lastShed) < s.cfg.CoolOff
	if hot {
		if m := s.maxInFlightLocked(); m > 0 && float64(s.inflight) >= math.Max(1, math.Ceil(m*share[c])) {
			s.lastShed = now
			s.count[ShedLimit][c]++
			s.shedEW += (1 - s.shedEW) / 64
			return ShedLimit, pushback(s.srtt, s.shedEW)
		}
	}
	s.inflight++
	s.count[Admitted][c]++
	s.shedEW -= s.shedEW / 64
	return Admitted, 0
}

// Release ends an admitted request that completed at now after rtt.
func (s *BBR) Release(now time.Time, rtt time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	s.rotate(now)
	s.b[s.head].pass++
	s.b[s.head].rtSum += max(rtt, 1)
	if s.srtt == 0 {
		s.srtt = float64(rtt)
	} else {
		s.srtt += (float64(rtt) - s.srtt) / 16
	}
}

// Abandon ends an admitted request without a sample.
func (s *BBR) Abandon() {
	s.mu.Lock()
	s.inflight--
	s.mu.Unlock()
}

// Snapshot returns the state at now; Limit is the current maxInFlight
// (rounded up; 0 before the first complete bucket).
func (s *BBR) Snapshot(now time.Time) Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rotate(now)
	return Snapshot{
		Limit: int(math.Ceil(s.maxInFlightLocked())), InFlight: s.inflight,
		SmoothedRTT: time.Duration(s.srtt), Count: s.count,
	}
}
