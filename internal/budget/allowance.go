package budget

import "sync/atomic"

// An Allowance rations an extra action to a share of events: each event
// credits the share of one action (Credit), up to a burst of whole actions,
// and each action takes one (Take). Unlike a Budget it knows no time: it
// bounds the actions per event over any run of events, so a sudden run in
// which every event would act gets at most the burst plus the share. The
// client rations the hedges of a delay read from recent latencies with it
// (twice the delay's tail share of calls, a burst of 4), so that while the
// delay lags a rise of the latency, and every call outlasts it, the calls
// are not all hedged.
//
// It is safe for concurrent use, lock-free, and counts in thousandths of an
// action. The zero value allows nothing; NewAllowance returns one that is
// full.
type Allowance struct {
	milli atomic.Int64 // thousandths of an action, in [0, burst]
	share int64        // credited per event, in thousandths
	burst int64        // in thousandths
}

// NewAllowance returns a full allowance that credits share (≥ 0) of an
// action per event and holds at most burst actions.
func NewAllowance(share float64, burst int) *Allowance {
	a := &Allowance{share: int64(share * 1000), burst: int64(burst) * 1000}
	a.milli.Store(a.burst)
	return a
}

// Credit adds one event's share.
func (a *Allowance) Credit() {
	for {
		old := a.milli.Load()
		n := min(old+a.share, a.burst)
		if n == old || a.milli.CompareAndSwap(old, n) {
			return
		}
	}
}

// Take takes one action, and reports whether one was left.
func (a *Allowance) Take() bool {
	for {
		old := a.milli.Load()
		if old < 1000 {
			return false
		}
		if a.milli.CompareAndSwap(old, old-1000) {
			return true
		}
	}
}

// Return gives back an action taken for nothing (it did not happen).
func (a *Allowance) Return() { a.milli.Add(1000) }
