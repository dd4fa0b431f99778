package budget

import (
	"errors"
	"math"
	"sync/atomic"
	"time"
)

// Defaults of [Config], as in the retryBudget block of a service config.
const (
	DefaultRatio               = 0.2
	DefaultMinRetriesPerSecond = 10
	DefaultTTL                 = 10 * time.Second
)

// Config is the normalized configuration of a [Budget]. Every field is used
// as written (Ratio 0 means no share of requests, not the default);
// [DefaultConfig] gives the defaults.
type Config struct {
	// Ratio is the share of requests that may be unrefunded retries, in
	// [0, 1000], used to three decimals (rounded).
	Ratio float64
	// MinRetriesPerSecond is the reserve that lets a quiet client retry:
	// MinRetriesPerSecond × TTL retries per window on top of the share. Not
	// negative.
	MinRetriesPerSecond float64
	// TTL is the length of the sliding window, at least 16 ms (see
	// [MinTTL]).
	TTL time.Duration
}

// DefaultConfig returns Ratio 0.2, MinRetriesPerSecond 10 and TTL 10s.
func DefaultConfig() Config {
	return Config{Ratio: DefaultRatio, MinRetriesPerSecond: DefaultMinRetriesPerSecond, TTL: DefaultTTL}
}

// MinTTL is the shortest window: 16 buckets of 1 ms.
const MinTTL = numBuckets * time.Millisecond

// Validate reports the first field of c that is out of range.
func (c Config) Validate() error {
	switch {
	case !(c.Ratio >= 0 && c.Ratio <= 1000):
		return errors.New("budget: ratio must be between 0 and 1000")
	case !(c.MinRetriesPerSecond >= 0) || math.IsInf(c.MinRetriesPerSecond, 1):
		return errors.New("budget: minRetriesPerSecond must be finite and not negative")
	case c.TTL < MinTTL:
		return errors.New("budget: ttl must be at least 16ms")
	}
	return nil
}

const (
	// numBuckets is the number of slices of the window. A power of two, so
	// that it divides 2^32 and a bucket's 32-bit epoch keeps its slot.
	numBuckets = 16
	// cost is the price of one retry in milli-retries, the unit of the
	// window's sums.
	cost = 1000
	// maxReserve caps the reserve (2^40 milli-retries, a billion retries),
	// far beyond anything a window can use.
	maxReserve = 1 << 40
)

// A Budget is a retry budget shared by all methods of a client. Use [New];
// the zero value is not usable.
type Budget struct {
	// buckets slice the window. Each word packs a bucket's epoch (the index
	// of its time slice since start, modulo 2^32) in the high 32 bits and
	// its net balance in milli-retries (deposits − unrefunded withdrawals,
	// an int32, saturating) in the low 32 bits. Bucket e%numBuckets holds
	// epoch e; a word whose epoch is older is reset by the next write.
	buckets [numBuckets]atomic.Uint64
	// calls counts the requests (OnRequest) of each bucket, packed as
	// buckets are (epoch above, count below, saturating), for Share.
	calls [numBuckets]atomic.Uint64

	// The fields below are set once by New.
	start   time.Time     // instant of epoch 0
	width   time.Duration // length of one bucket: TTL / numBuckets
	deposit int64         // milli-retries deposited per request: Ratio × 1000
	reserve int64         // milli-retries always available: MinRetriesPerSecond × TTL × 1000
}

// New returns a Budget whose window starts at now, empty but for the
// reserve.
func New(cfg Config, now time.Time) (*Budget, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Budget{
		start:   now,
		width:   cfg.TTL / numBuckets,
		deposit: int64(math.Round(cfg.Ratio * cost)),
		reserve: int64(min(math.Round(cfg.MinRetriesPerSecond*cfg.TTL.Seconds()*cost), maxReserve)),
	}, nil
}

// A Retry is one retry withdrawn from a [Budget] by [Budget.TryRetry]. Give
// it back to [Budget.Refund] when the retry succeeded. The zero Retry stands
// for no withdrawal; refunding it does nothing.
type Retry struct {
	// epoch is the epoch of the bucket the withdrawal went to, plus one.
	epoch uint64
}

// OnRequest deposits Ratio retries: call it once per logical call, before
// its first attempt. It never blocks and never fails.
func (b *Budget) OnRequest(now time.Time) {
	e := b.epoch(now)
	if b.deposit != 0 {
		b.add(e, b.deposit, false)
	}
	b.count(e)
}

// count counts a request in the bucket of epoch e.
func (b *Budget) count(e uint64) {
	slot := &b.calls[e%numBuckets]
	ep := uint32(e)
	for {
		old := slot.Load()
		var n uint32
		switch age := int32(ep - uint32(old>>32)); {
		case age == 0:
			n = uint32(old)
			if n == math.MaxUint32 {
				return
			}
			n++
		case age > 0:
			n = 1
		default:
			return // a newer epoch holds the bucket: now lags a window behind
		}
		if slot.CompareAndSwap(old, uint64(ep)<<32|uint64(n)) {
			return
		}
	}
}

// Share returns the share of the requests over the window at now that the
// budget pays a retry for: (reserve + Ratio × requests) / requests, that is
// Ratio + MinRetriesPerSecond / (requests per second); 1 or more when the
// budget pays for a retry of every request (or there were none), 0 when it
// pays for none (Ratio and MinRetriesPerSecond 0). It reads the 16
// buckets; nothing is written.
func (b *Budget) Share(now time.Time) float64 {
	if b.deposit == 0 && b.reserve == 0 {
		return 0
	}
	ep := uint32(b.epoch(now))
	var n uint64
	for i := range b.calls {
		w := b.calls[i].Load()
		if age := int32(ep - uint32(w>>32)); age > -numBuckets && age < numBuckets {
			n += uint64(uint32(w))
		}
	}
	if n == 0 {
		return math.Inf(1)
	}
	return (float64(b.reserve) + float64(b.deposit)*float64(n)) / (cost * float64(n))
}

// TryRetry withdraws one retry if the budget can pay for it, that is if
// after the withdrawal
//
//	reserve + Ratio × requests − unrefunded retries ≥ 0
//
// over the window, and reports whether it could. Call it before each retry,
// after every other check that could still stop the retry (attempts left,
// deadline, throttle), so that a withdrawal is a retry that will be sent. A
// retry denied here ends the call with the last attempt's error.
//
// Two goroutines that race for the last retry may both be refused; the
// budget is never overdrawn.
func (b *Budget) TryRetry(now time.Time) (Retry, bool) {
	e := b.epoch(now)
	if b.balance(e) < cost { // cheap refusal: no write while the budget is spent
		return Retry{}, false
	}
	if !b.add(e, -cost, false) {
		return Retry{}, false
	}
	if b.balance(e) >= 0 {
		return Retry{epoch: e + 1}, true
	}
	b.add(e, cost, true) // another withdrawal won the race: undo ours
	return Retry{}, false
}

// Refund gives back the retry r: call it when the retry's attempt did not
// fail with a retryable code (the server answered), or when the retry was
// never sent (the call was cancelled during backoff). A refunded retry costs
// nothing, so retries that succeed do not spend the budget and only failing
// retries, the load on a sick server, do. The refund cancels the withdrawal
// in the bucket it was taken from; once that bucket has left the window there
// is nothing to give back. Refund each Retry at most once.
func (b *Budget) Refund(r Retry) {
	if r.epoch != 0 {
		b.add(r.epoch-1, cost, true)
	}
}

// Available returns how many retries TryRetry would grant at now, as a
// fraction: reserve + Ratio × requests − unrefunded retries over the window.
// It may be negative for a while when the requests that paid for recent
// retries leave the window before those retries do.
func (b *Budget) Available(now time.Time) float64 {
	return float64(b.balance(b.epoch(now))) / cost
}

// epoch returns the index of now's bucket since start; an instant before
// start counts as start.
func (b *Budget) epoch(now time.Time) uint64 {
	d := now.Sub(b.start)
	if d < 0 {
		return 0
	}
	return uint64(d / b.width)
}

// add adds delta milli-retries to the bucket of epoch e, saturating at the
// int32 bounds, and reports whether it did. A bucket that holds an older
// epoch is reset first, unless sameEpoch is set: then the delta is dropped,
// because what it would cancel has left the window. A bucket that holds a
// newer epoch (now lags a whole window behind another caller's) is left
// alone and the delta dropped.
func (b *Budget) add(e uint64, delta int64, sameEpoch bool) bool {
	slot := &b.buckets[e%numBuckets]
	ep := uint32(e)
	for {
		old := slot.Load()
		var v int64
		switch age := int32(ep - uint32(old>>32)); {
		case age == 0:
			v = int64(int32(uint32(old))) + delta
		case age > 0 && !sameEpoch:
			v = delta
		default:
			return false
		}
		v = min(max(v, math.MinInt32), math.MaxInt32)
		word := uint64(ep)<<32 | uint64(uint32(int32(v)))
		if word == old || slot.CompareAndSwap(old, word) {
			return true
		}
	}
}

// balance returns reserve + the balances of the buckets in the window of
// epoch e: e and the numBuckets−1 before it, and any bucket a caller whose
// clock runs slightly ahead already opened.
func (b *Budget) balance(e uint64) int64 {
	ep := uint32(e)
	total := b.reserve
	for i := range b.buckets {
		w := b.buckets[i].Load()
		if age := int32(ep - uint32(w>>32)); age > -numBuckets && age < numBuckets {
			total += int64(int32(uint32(w)))
		}
	}
	return total
}
