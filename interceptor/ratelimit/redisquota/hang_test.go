package redisquota

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// TestEveryFallbackLeasesAgainAfterRedisHangs: Redis stops answering
// without closing anything (a partition: redistest.Proxy.Stall), under each
// fallback mode, with a lease timeout longer than the probe interval, so
// that the probes hang past their instants. Calls never wait past the lease
// timeout; the limiter enters fallback and decides by its mode (open admits
// every call, closed refuses each one its held tokens do not cover, telling
// it to come back within a probe interval and never at once, the local
// share admits some and refuses some);
// once Redis answers again it leases again within 2 s, its decisions no
// longer by the fallback, though the replies held during the partition
// arrive then on the connections that timed out.
func TestEveryFallbackLeasesAgainAfterRedisHangs(t *testing.T) {
	addr := redistest.Addr(t)
	const timeout, probe = 100 * time.Millisecond, 20 * time.Millisecond
	for _, fb := range []Fallback{FallbackOpen, FallbackClosed, FallbackLocalShare} {
		t.Run(fb.String(), func(t *testing.T) {
			proxy := redistest.StartProxy(t, addr)
			c := client(t, proxy.Addr)
			s := newStore(t, c, redistest.Prefix(t), WithLeaseTimeout(timeout), WithLogger(slog.New(slog.DiscardHandler)))
			l := newLimiter(t, s, "hang", Limit{Rate: 1000, Burst: 10, Fallback: fb, ProbeInterval: probe})
			ctx := context.Background()
			leased := func(within time.Duration) {
				t.Helper()
				for start := time.Now(); ; {
					d, err := l.Allow(ctx, "k", wire.Critical)
					if err != nil {
						t.Fatal(err)
					}
					if !d.Fallback && !l.InFallback() {
						return
					}
					if time.Since(start) > within {
						t.Fatalf("no call decided by a lease within %v with Redis answering (in fallback: %v)", within, l.InFallback())
					}
					time.Sleep(time.Millisecond) // polling interval: the limiter probes on calls
				}
			}
			leased(5 * time.Second) // a busy machine's first lease may pass the timeout
			proxy.Stall()
			// Decisions for three lease timeouts after the first by the
			// fallback: the probes the limiter sends meanwhile hang too.
			var admitted, refused int
			var first time.Time
			for start := time.Now(); first.IsZero() || time.Since(first) < 3*timeout; {
				if time.Since(start) > 5*time.Second {
					t.Fatalf("Redis hung for 5s: %d decisions by the fallback (%d admitted), in fallback %v",
						admitted+refused, admitted, l.InFallback())
				}
				begin := time.Now()
				d, err := l.Allow(ctx, "k", wire.Critical)
				if err != nil {
					t.Fatal(err)
				}
				// Past the lease timeout, only a busy machine's scheduling.
				if took := time.Since(begin); took > timeout+time.Second {
					t.Fatalf("a call took %v with Redis hung: past the lease timeout (%v)", took, timeout)
				}
				if !d.Fallback {
					continue // a token held from before the partition
				}
				if first.IsZero() {
					first = time.Now()
				}
				if d.OK {
					admitted++
					continue
				}
				refused++
				if fb == FallbackClosed && (d.Wait <= 0 || d.Wait > probe) {
					t.Fatalf("closed fallback: refused with wait %v, want within the probe interval (%v]", d.Wait, probe)
				}
			}
			switch {
			case fb == FallbackOpen && refused > 0:
				t.Fatalf("open fallback refused %d of %d calls", refused, admitted+refused)
			case fb == FallbackClosed && admitted > 0:
				t.Fatalf("closed fallback admitted %d of %d calls", admitted, admitted+refused)
			case fb == FallbackLocalShare && (admitted == 0 || refused == 0):
				// Calls in a loop far faster than 1000 a second, with a
				// local bucket of 10: some pass, most wait.
				t.Fatalf("local share: %d admitted, %d refused; want some of each", admitted, refused)
			}
			t.Logf("%d decisions by the fallback: %d admitted", admitted+refused, admitted)
			proxy.Resume()
			leased(2 * time.Second)
		})
	}
}
