package interceptor_test

import (
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestHedgingDelayComesBackAfterABurstOfSlowCalls pins that a short burst
// of slow calls (a server pause: six calls in a row take 45ms, every copy
// of them) does not leave the slow tail unhedged once it is over. On the
// slow-tail workload (2ms, or 40ms with probability 5%; one caller, fake
// time over real gRPC) hedged at the p95, the burst's copies pass the delay
// in force, both copies of each call, and 12 of them restart the window
// from the last 16 copies (the drift detector of hedge_delay.go), most of
// them the burst's: the delay jumps above the 40ms tail. The burst's copies
// then outweighed the tail's share of the window until hundreds of calls
// had followed: 178 of the 400 calls after the burst were sent with the
// delay above the tail, 9 of them took 40ms or more (p99 40ms, the
// unhedged). The window of 256 to 512 copies alone (before the detector)
// took the burst in its stride: none, 2 (copies both slow), p99 7.2ms. Now
// the copies that fall back below the delay the restart left restart the
// window again, from those of them in the last 16 copies: 16 calls (the
// detector's cadence), 5 of 40ms or more.
func TestHedgingDelayComesBackAfterABurstOfSlowCalls(t *testing.T) {
	const warm, burst, after = 1000, 6, 400
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			i, _ := strconv.Atoi(a.Messages[0])
			if i >= warm && i < warm+burst {
				return testserver.Outcome{Delay: 45 * time.Millisecond}
			}
			return testserver.Outcome{Delay: tailLatency(a.N, 2*time.Millisecond)}
		})
		c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name:          []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
			HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.95},
		}))
		if err != nil {
			t.Fatal(err)
		}
		client := echov1.NewEchoServiceClient(testserver.Start(t, srv, c.DialOptions()...))
		var lat []time.Duration
		stuck := 0 // calls after the burst sent with the delay at or above the tail
		for i := range warm + burst + after {
			if d, _ := c.HedgingDelay(echoMethod); i >= warm+burst && d >= 40*time.Millisecond {
				stuck++
			}
			start := time.Now()
			if _, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: strconv.Itoa(i)}); err != nil {
				t.Fatalf("Echo: %v", err)
			}
			lat = append(lat, time.Since(start))
			synctest.Wait() // the losing copy ends: the next call starts alone
		}
		before, afterBurst := lat[warm-after:warm], lat[warm+burst:]
		slow := 0
		for _, d := range afterBurst {
			if d >= 40*time.Millisecond {
				slow++
			}
		}
		p99Before, p99After := quantile(before, 0.99), quantile(afterBurst, 0.99)
		d, _ := c.HedgingDelay(echoMethod)
		t.Logf("p99 %v in the %d calls before the burst, %v in the %d after (%d of 40ms or more, %d sent with the delay above the tail); delay at the end %v",
			p99Before, after, p99After, after, slow, stuck, d)
		if p99Before > 10*time.Millisecond {
			t.Fatalf("p99 %v before the burst, want at most 10ms: the workload is not hedged as it should be", p99Before)
		}
		if stuck > 2*16 || slow > 6 {
			t.Errorf("after a burst of %d slow calls: %d of the next %d calls sent with the delay above the 40ms tail, %d of them 40ms or more (p99 %v); "+
				"want at most 32 (two recomputes) and 6", burst, stuck, after, slow, p99After)
		}
	})
}
