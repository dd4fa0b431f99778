package endpoint

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// liveLB returns the policy of the channel to target.
func liveLB(t *testing.T, target string) *lb {
	t.Helper()
	var found *lb
	live.Range(func(k, _ any) bool {
		if b := k.(*lb); b.target == target {
			found = b
			return false
		}
		return true
	})
	if found == nil {
		t.Fatalf("no live policy for %s", target)
	}
	return found
}

// entryOf returns b's entry for the endpoint at addr.
func entryOf(t *testing.T, b *lb, addr string) *entry {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.entries.All() {
		if e.name == addr {
			return e
		}
	}
	t.Fatalf("no entry for %s", addr)
	return nil
}

func ewmaConfig(settings string) string {
	return `{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"peak_ewma": ` + settings + `}]}}]}`
}

// TestEndpointConcurrencyUpdateReachesThePickerMidFlight pushes a new
// service config through the resolver while 16 calls are in flight over
// real grpc, and reads where the next call goes: with two endpoints both
// are the two choices of every pick, so the pick is the cheaper one. The
// fast endpoint (5ms, 16 calls held) against the idle slow one (50ms):
// 5 × (1 + 16/4) = 25 < 50 at the default, 5 × 17 = 85 > 50 at 1. τ is an
// hour, so the estimates hold still. Then the child switches to
// round_robin and back, and every call's end brings every endpoint's
// outstanding count back to 0.
func TestEndpointConcurrencyUpdateReachesThePickerMidFlight(t *testing.T) {
	cl := resiliencetest.StartCluster(t, 2, nil, resiliencetest.WithServiceConfig(ewmaConfig(`{"decayTime": "3600s"}`)))
	b := liveLB(t, cl.Conn.Target())
	fast, slow := entryOf(t, b, cl.Addrs[0]), entryOf(t, b, cl.Addrs[1])
	now := b.nanotimeNow()
	fast.lat.Observe(now, 5*time.Millisecond, time.Hour)
	slow.lat.Observe(now, 50*time.Millisecond, time.Hour)

	release := make(chan struct{})
	arrived := make(chan int, 64)
	cl.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
		arrived <- 0
		<-release // held: the fast endpoint's attempts stay outstanding
		return resiliencetest.Step{}
	})
	cl.Backends[1].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
		arrived <- 1
		return resiliencetest.Step{}
	})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseAll)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a bound, not a wait
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	// call starts a call; its channel closes when the call has returned
	// (its attempt's Done callback has run).
	call := func() <-chan struct{} {
		wg.Add(1)
		ended := make(chan struct{})
		go func() {
			defer wg.Done()
			defer close(ended)
			if _, err := cl.EchoClient().Echo(ctx, &echov1.EchoRequest{Message: "x"}); err != nil {
				errs <- err
			}
		}()
		return ended
	}
	next := func() int {
		t.Helper()
		select {
		case i := <-arrived:
			return i
		case <-ctx.Done():
			t.Fatal("no attempt arrived")
			return -1
		}
	}

	for range 16 {
		call()
	}
	for i := range 16 {
		if got := next(); got != 0 {
			t.Fatalf("call %d went to backend %d: at the default a fast endpoint with fewer than 36 out is cheaper", i, got)
		}
	}
	if got := fast.outstanding.Load(); got != 16 {
		t.Fatalf("fast endpoint outstanding = %d, want 16", got)
	}

	steps := []struct {
		config string
		want   int // the backend the next call goes to
		why    string
	}{
		{ewmaConfig(`{"decayTime": "3600s", "endpointConcurrency": 1}`), 1, "at 1: 5ms × 17 > 50ms"},
		{ewmaConfig(`{"decayTime": "3600s"}`), 0, "back at the default: 5ms × 5 < 50ms"},
		{ewmaConfig(`{"decayTime": "3600s", "endpointConcurrency": 1}`), 1, "at 1 again: 5ms × 18 > 50ms"},
	}
	for _, st := range steps {
		if err := cl.SetServiceConfig(st.config); err != nil {
			t.Fatal(err)
		}
		ended := call()
		if got := next(); got != st.want {
			t.Fatalf("after %s: the call went to backend %d, want %d (%s); perAttempt in the policy's config %v",
				st.config, got, st.want, st.why, b.cfg.Load().perAttempt)
		}
		if st.want == 1 { // the slow endpoint answers at once: idle again before the next step
			select {
			case <-ended:
			case <-ctx.Done():
				t.Fatal("the call to the slow endpoint did not return")
			}
		}
	}

	// Switch the child mid-flight: round_robin, then peak_ewma again.
	if err := cl.SetServiceConfig(`{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"round_robin": {}}]}}]}`); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		call()
		next()
	}
	if err := cl.SetServiceConfig(ewmaConfig(`{"endpointConcurrency": 16}`)); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		call()
		next()
	}
	releaseAll()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("call failed: %v", err)
	}
	for _, e := range []*entry{fast, slow} {
		if got := e.outstanding.Load(); got != 0 {
			t.Errorf("%s: outstanding = %d after every call ended, want 0", e.name, got)
		}
	}
}

// TestConfigChurnUnderLoadLeavesNothingOutstanding cycles the child
// policy and endpointConcurrency through the resolver while 16 goroutines
// call over real grpc, under the race detector: every call succeeds, and
// once they have all returned no endpoint has an attempt outstanding (the
// package's goleak checks the goroutines).
func TestConfigChurnUnderLoadLeavesNothingOutstanding(t *testing.T) {
	cl := resiliencetest.StartCluster(t, 3, nil, resiliencetest.WithServiceConfig(ewmaConfig(`{}`)))
	b := liveLB(t, cl.Conn.Target())
	configs := []string{
		ewmaConfig(`{"endpointConcurrency": 1}`),
		`{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"round_robin": {}}]}}]}`,
		ewmaConfig(`{"endpointConcurrency": 16, "decayTime": "0.1s"}`),
		`{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"pick_first": {}}]}}]}`,
		ewmaConfig(`{}`),
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	calls := make([]int, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					if i >= 20 {
						return
					}
				default:
				}
				if _, err := cl.EchoClient().Echo(ctx, &echov1.EchoRequest{Message: fmt.Sprint(g, i)}, grpc.WaitForReady(true)); err != nil {
					errs <- err
					return
				}
				calls[g]++
			}
		}()
	}
	for range 3 {
		for _, c := range configs {
			if err := cl.SetServiceConfig(c); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("call failed: %v", err)
	}
	if got, want := b.cfg.Load().perAttempt, 0.25; got != want {
		t.Errorf("perAttempt after the last config (the default) = %v, want %v", got, want)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.entries.All() {
		if got := e.outstanding.Load(); got != 0 {
			t.Errorf("%s: outstanding = %d after every call returned, want 0", e.name, got)
		}
	}
}

// TestBadEndpointConcurrencyIsRefusedByTheChannel pins the path through
// grpc: the registered builder's parser refuses each bad value with the
// policy's JSON path, at dial and when the resolver pushes it mid-flight
// (grpc then keeps the config it had: the weight in the policy is
// unchanged).
func TestBadEndpointConcurrencyIsRefusedByTheChannel(t *testing.T) {
	const path = "resilience_endpoint.childPolicy[0].peak_ewma.endpointConcurrency"
	bad := []struct{ settings, want string }{
		{`{"endpointConcurrency": 0.5}`, path + ": must be an integer"},
		{`{"endpointConcurrency": 4.0}`, path + ": must be an integer"},
		{`{"endpointConcurrency": 1e3}`, path + ": must be an integer"},
		{`{"endpointConcurrency": -1}`, path + ": must be in [1, 16]"},
		{`{"endpointConcurrency": 17}`, path + ": must be in [1, 16]"},
		{`{"endpointConcurrency": 99999999999999999999}`, path + ":"},
		{`{"endpointConcurrency": "4"}`, path + ":"},
		{`{"endpointConcurrency": true}`, path + ":"},
		{`{"endpointconcurency": 4}`, "resilience_endpoint.childPolicy[0].peak_ewma.endpointconcurency"},
	}
	for _, tt := range bad {
		_, _, err := resiliencetest.ServeCluster(2, nil, resiliencetest.WithServiceConfig(ewmaConfig(tt.settings)))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("dial with peak_ewma %s: err = %v, want it to contain %q", tt.settings, err, tt.want)
		}
	}
	for _, doc := range []string{
		`{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"round_robin": {"endpointConcurrency": 4}}]}}]}`,
		`{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"pick_first": {"endpointConcurrency": 4}}]}}]}`,
		`{"loadBalancingConfig": [{"resilience_endpoint": {"endpointConcurrency": 4}}]}`,
	} {
		if _, _, err := resiliencetest.ServeCluster(2, nil, resiliencetest.WithServiceConfig(doc)); err == nil || !strings.Contains(err.Error(), "endpointConcurrency") {
			t.Errorf("dial with %s: err = %v, want a refusal naming endpointConcurrency", doc, err)
		}
	}

	cl := resiliencetest.StartCluster(t, 2, nil, resiliencetest.WithServiceConfig(ewmaConfig(`{"endpointConcurrency": 2}`)))
	b := liveLB(t, cl.Conn.Target())
	for _, tt := range bad {
		if err := cl.SetServiceConfig(ewmaConfig(tt.settings)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("resolver push of peak_ewma %s: err = %v, want it to contain %q", tt.settings, err, tt.want)
		}
	}
	if got := b.cfg.Load().perAttempt; got != 0.5 {
		t.Errorf("perAttempt after refused pushes = %v, want 0.5 (endpointConcurrency 2)", got)
	}
}

// TestSlowEndpointLooksCheaperOnlyPast36AtTheDefault pins the docs' figure
// (bench's endpoint-slow note): an idle endpoint at 50ms against one at 5ms
// with k attempts out: 5 × (1 + k/4) equals 50 at k = 36 (a tie, which the
// first drawn wins), so the slow one is strictly cheaper from 37.
func TestSlowEndpointLooksCheaperOnlyPast36AtTheDefault(t *testing.T) {
	pk, b := newTestPicker(t, 2, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma"})
	now := b.nanotime(time.Now())
	pk.ready[0].e.lat.Observe(now, 5*time.Millisecond, pk.decay)
	pk.ready[1].e.lat.Observe(now, 50*time.Millisecond, pk.decay)
	for _, tt := range []struct {
		out       int32
		slowFirst int // cheaper(slow, fast)
		fastFirst int // cheaper(fast, slow)
	}{
		{35, 0, 0}, {36, 1, 0}, {37, 1, 1},
	} {
		pk.ready[0].e.outstanding.Store(tt.out)
		if got, _ := pk.cheaper(1, 0, now); got != tt.slowFirst {
			t.Errorf("%d out on the fast one: cheaper(slow, fast) = ep%d, want ep%d", tt.out, got, tt.slowFirst)
		}
		if got, _ := pk.cheaper(0, 1, now); got != tt.fastFirst {
			t.Errorf("%d out on the fast one: cheaper(fast, slow) = ep%d, want ep%d", tt.out, got, tt.fastFirst)
		}
	}
	pk.ready[0].e.outstanding.Store(0)
}

// TestSnapshotShowsPeakEWMAWeights pins what an operator can check after a
// resolver pushed a config: the snapshot names the child policy, and for
// peak_ewma it must also say the cost's weights in effect, or a pushed
// endpointConcurrency (which moves a slow endpoint's share from 0.2% to
// 1.5% in bench's endpoint-slow) cannot be confirmed short of reading the
// traffic. Today Snapshot and its String carry neither endpointConcurrency
// nor the decay time.
func TestSnapshotShowsPeakEWMAWeights(t *testing.T) {
	cl := resiliencetest.StartCluster(t, 2, nil, resiliencetest.WithServiceConfig(ewmaConfig(`{"endpointConcurrency": 1}`)))
	var text string
	for _, s := range Snapshots(time.Now()) {
		if s.Target == cl.Conn.Target() {
			text = s.String()
		}
	}
	if text == "" {
		t.Fatal("no snapshot for the channel")
	}
	if !strings.Contains(text, "endpointConcurrency 1") {
		t.Errorf("Snapshot.String() = %q: no word of endpointConcurrency 1, the weight the picker uses", text)
	}
}
