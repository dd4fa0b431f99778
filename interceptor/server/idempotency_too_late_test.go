package server

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// idemSlowClaims is a store whose Claim answers delay after it was asked,
// as a store across a slow link does: its lease runs from when the claim
// reached it, but the server counts it from before the claim was sent.
type idemSlowClaims struct {
	idempotency.Store
	delay time.Duration
}

func (s idemSlowClaims) Claim(ctx context.Context, k idempotency.RecordKey, fp []byte, lease time.Duration) (idempotency.Claim, error) {
	time.Sleep(s.delay)
	return s.Store.Claim(ctx, k, fp, lease)
}

// TestIdempotencyClaimAnsweredTooLateDoesNotRun pins the claim that comes
// back past its lease's cutoff (nine tenths of the lease, counted from
// before the claim was sent): its handler never starts, since its context
// would be cut at once and a duplicate could claim the key before it ends;
// the call gets UNAVAILABLE with the retry hint both ways (RetryInfo and
// the pushback trailer), never stored, and its claim is released: the
// retry runs at once, not a lease later. A claim back in time runs as
// usual. Nothing tested this path (srvIdemCall.claimedTooLate), which
// also logged that the handler, which never ran, was being cancelled.
func TestIdempotencyClaimAnsweredTooLateDoesNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = time.Second
		mem, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		var refusals []Refusal
		var log idemLog
		e := &idemEcho{}
		late := idemSlowClaims{Store: mem, delay: lease - srvLeaseMargin(lease)} // at the cutoff: too late
		ccLate := idemStart(t, e, Idempotency{Store: late, Lease: lease, Pushback: 250 * time.Millisecond},
			WithOnRefusal(func(_ context.Context, r Refusal) { refusals = append(refusals, r) }), WithLogger(log.logger()))
		c := idemDo(context.Background(), ccLate, "k", "m")
		wantCode(t, "a claim answered at its lease's cutoff", c.err, codes.Unavailable, "too late")
		wantCalls(t, e, 0)
		if d := idemRetryDelay(c.err); d != 250*time.Millisecond {
			t.Errorf("RetryInfo delay = %v, want the pushback, 250ms", d)
		}
		if got := c.trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "250" {
			t.Errorf("grpc-retry-pushback-ms = %q, want [250]", got)
		}
		if len(refusals) != 1 || refusals[0].Reason != RefusalStoreUnavailable || !isShed(refusals[0].Err) {
			t.Errorf("refusals reported: %+v; want one, RefusalStoreUnavailable, the server's own refusal", refusals)
		}
		// One warning, that the handler did not run; not, as the lease's
		// renewal also logged when it was started for the call, that a
		// handler that never ran was being cancelled.
		synctest.Wait()
		if got := log.String(); strings.Count(got, "WARN") != 1 || !strings.Contains(got, "too late") {
			t.Errorf("log:\n%s\nwant one warning, that the claim came back too late", got)
		}

		// Released, not stored: the retry, on a store that answers in time,
		// claims the key at once and runs the handler, fresh.
		inTime := idemSlowClaims{Store: mem, delay: lease - srvLeaseMargin(lease) - time.Millisecond}
		ccInTime := idemStart(t, e, Idempotency{Store: inTime, Lease: lease})
		start := time.Now()
		r := idemDo(context.Background(), ccInTime, "k", "m")
		if r.err != nil || wire.IdempotencyReplayed(r.header) {
			t.Fatalf("the retry: %v, replayed %v; want it run, fresh", r.err, wire.IdempotencyReplayed(r.header))
		}
		if took := time.Since(start); took != inTime.delay {
			t.Errorf("the retry took %v, want its claim's %v: the late claim was left held", took, inTime.delay)
		}
		wantCalls(t, e, 1)
	})
}
