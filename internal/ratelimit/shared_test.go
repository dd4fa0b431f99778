package ratelimit

import (
	"container/heap"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeStore is the store's side of leasing, as the Redis script does it
// (interceptor/ratelimit/redisquota), on fake time in nanoseconds: GCRA on
// the whole quota of each key, a lease of Want tokens granted when at
// least Min fit within the horizon, and the replicas seen within the
// window.
type fakeStore struct {
	keyTrips map[string]int
	tat      map[string]int64
	seen     map[string]map[int]int64
	down     bool
	trips    int
	refusals int
}

func newFakeStore() *fakeStore {
	return &fakeStore{tat: map[string]int64{}, seen: map[string]map[int]int64{}, keyTrips: map[string]int{}}
}

func (f *fakeStore) lease(now int64, replica int, l *Lease) (Grant, error) {
	if l.Overflow {
		if l.Key != "" {
			return Grant{}, fmt.Errorf("an overflow lease with the key %q", l.Key)
		}
		l2 := *l
		l2.Key = overflowKey
		l = &l2
	}
	f.trips++
	f.keyTrips[l.Key]++
	if f.down {
		return Grant{}, errors.New("store down")
	}
	t, tau, h := int64(l.Interval), int64(l.Tau), int64(l.Horizon)
	if f.seen[l.Key] == nil {
		f.seen[l.Key] = map[int]int64{}
	}
	f.seen[l.Key][replica] = now
	n := 0
	for _, at := range f.seen[l.Key] {
		if now-at <= int64(l.ReplicaWindow) {
			n++
		}
	}
	base := max(f.tat[l.Key], now)
	room := (now + tau + h - base) / t
	if now+tau+h < base {
		room = -1
	}
	k := min(int64(l.Want), room)
	if k < int64(l.Min) {
		f.refusals++
		return Grant{RetryAfter: time.Duration(base + int64(l.Min)*t - (now + tau + h)), Replicas: n}, nil
	}
	nt := base + k*t
	f.tat[l.Key] = nt
	left := max(0, (now+tau-nt)/t)
	return Grant{Tokens: int(k), FirstSlot: time.Duration(base + t - tau - now), Left: int(left), Replicas: n}, nil
}

// event is a call arriving at a replica, or a lease's answer reaching it.
type event struct {
	at      int64
	replica int
	key     string
	lease   *Lease
	grant   Grant
	err     error
	seq     int
}

type events []event

func (q events) Len() int { return len(q) }
func (q events) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q events) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)   { *q = append(*q, x.(event)) }
func (q *events) Pop() any {
	o := *q
	x := o[len(o)-1]
	*q = o[:len(o)-1]
	return x
}

// cluster runs replicas of one Shared limit against a fakeStore on fake
// time, with a fixed round trip: a lease is granted at its send plus half
// the round trip, and delivered at its send plus the round trip. A call
// told Pending waits for its lease's answer and is decided again then.
type cluster struct {
	t        *testing.T
	replicas []*Shared
	store    *fakeStore
	rtt      int64
	q        events
	seq      int
	waiting  map[*Lease][]event
	inflight map[<-chan struct{}]*Lease
	admitted map[string][]int // per key, per second
	refused  int
	fallback int
	killed   map[int]bool
}

func newCluster(t *testing.T, n int, cfg SharedConfig, rtt time.Duration) *cluster {
	c := &cluster{t: t, store: newFakeStore(), rtt: int64(rtt), waiting: map[*Lease][]event{}, inflight: map[<-chan struct{}]*Lease{},
		admitted: map[string][]int{}, killed: map[int]bool{}}
	for range n {
		s, err := NewShared(cfg, t0)
		if err != nil {
			t.Fatal(err)
		}
		c.replicas = append(c.replicas, s)
	}
	return c
}

func (c *cluster) push(e event) {
	c.seq++
	e.seq = c.seq
	heap.Push(&c.q, e)
}

// arrivals schedules Poisson calls for key at replica r, rate per second,
// from start to end.
func (c *cluster) arrivals(rng *rand.Rand, r int, key string, rate float64, start, end time.Duration) {
	for at := float64(start); at < float64(end); at += rng.ExpFloat64() * float64(time.Second) / rate {
		c.push(event{at: int64(at), replica: r, key: key})
	}
}

func (c *cluster) run() {
	for c.q.Len() > 0 {
		e := heap.Pop(&c.q).(event)
		switch e.replica {
		case -1: // the store goes down
			c.store.down = true
			continue
		case -2: // and comes back
			c.store.down = false
			continue
		case -3: // replica 0 dies
			c.killed[0] = true
			continue
		}
		if c.killed[e.replica] {
			continue
		}
		s := c.replicas[e.replica]
		now := t0.Add(time.Duration(e.at))
		if e.lease != nil { // an answer
			s.Deliver(e.lease, now, e.grant, e.err)
			delete(c.inflight, e.lease.done)
			calls := c.waiting[e.lease]
			delete(c.waiting, e.lease)
			for _, w := range calls {
				c.decide(s, e.at, w)
			}
			continue
		}
		c.decide(s, e.at, e)
	}
}

func (c *cluster) decide(s *Shared, at int64, e event) {
	d, l := s.Decide(t0.Add(time.Duration(at)), e.key, Critical)
	if l != nil {
		g, err := c.store.lease(at+c.rtt/2, e.replica, l)
		c.push(event{at: at + c.rtt, replica: e.replica, lease: l, grant: g, err: err})
		c.inflight[l.done] = l
	}
	switch {
	case d.OK:
		sec := int(at / int64(time.Second))

		for len(c.admitted[e.key]) <= sec {
			c.admitted[e.key] = append(c.admitted[e.key], 0)
		}
		c.admitted[e.key][sec]++
		if d.Fallback {
			c.fallback++
		}
	case d.Pending != nil:
		lease, ok := c.inflight[d.Pending]
		if !ok {
			c.t.Fatalf("Pending without a lease in flight")
		}
		c.waiting[lease] = append(c.waiting[lease], e)
	default:
		c.refused++
	}
}

func sharedCfg(rate float64, burst int) SharedConfig {
	return SharedConfig{Config: Config{Rate: rate, Burst: burst}}
}

// TestSharedFourReplicasExactEachSecond is the distributed target
// on fake time: 4 replicas share a per-tenant limit of 1,000/s, offered
// 4,000/s spread 70/10/10/10; the admitted total is within ±3% of 1,000
// each second after the first, with at most one round trip per 20
// admitted calls. A second tenant at its own limit on the same replicas
// is unaffected: it gets what one local limiter would give the same calls.
func TestSharedFourReplicasExactEachSecond(t *testing.T) {
	c := newCluster(t, 4, sharedCfg(1000, 100), 500*time.Microsecond)
	rng := rand.New(rand.NewPCG(4, 4))
	for r, share := range []float64{0.7, 0.1, 0.1, 0.1} {
		c.arrivals(rng, r, "tenant-a", 4000*share, 0, 10*time.Second)
		c.arrivals(rng, r, "tenant-b", 250, 0, 10*time.Second) // 1,000/s in all: at its limit
	}
	alone := localBaseline(t, c, "tenant-b", Config{Rate: 1000, Burst: 100})
	c.run()
	a := c.admitted["tenant-a"]
	total := 0
	for sec, n := range a {
		total += n
		if sec > 0 && (n < 970 || n > 1030) {
			t.Errorf("tenant-a second %d: %d admitted, want 1000 ± 3%%", sec, n)
		}
	}
	if trips := c.store.keyTrips["tenant-a"]; trips*20 > total {
		t.Errorf("tenant-a: %d round trips for %d admitted: more than one per 20", trips, total)
	}
	b := c.admitted["tenant-b"]
	for sec := range alone {
		if d := b[sec] - alone[sec]; d < -30 || d > 30 {
			t.Errorf("tenant-b second %d: %d admitted, where one local limiter admits %d of the same calls", sec, b[sec], alone[sec])
		}
	}
	t.Logf("tenant-a %v, %d round trips; tenant-b %v (alone %v), %d round trips; %d tokens forfeited", a, c.store.keyTrips["tenant-a"], b, alone, c.store.keyTrips["tenant-b"], c.replicas[0].Forfeited()+c.replicas[1].Forfeited()+c.replicas[2].Forfeited()+c.replicas[3].Forfeited())
}

// localBaseline runs the calls c has scheduled for key through one local
// Limiter of cfg and returns its admitted count per second.
func localBaseline(t *testing.T, c *cluster, key string, cfg Config) []int {
	l := mustNew(t, cfg)
	q := append(events(nil), c.q...)
	var out []int
	for q.Len() > 0 {
		e := heap.Pop(&q).(event)
		if e.key != key {
			continue
		}
		if ok, _ := l.Allow(t0.Add(time.Duration(e.at)), key, Critical); ok {
			sec := int(e.at / int64(time.Second))
			for len(out) <= sec {
				out = append(out, 0)
			}
			out[sec]++
		}
	}
	return out
}

// TestSharedColdKeyWaitsForItsFirstLease: a key's first call holds no
// token: it is told Pending, with a lease to send; once the grant is
// delivered, deciding again admits it. No second lease is asked while one
// is in flight.
func TestSharedColdKeyWaitsForItsFirstLease(t *testing.T) {
	s, err := NewShared(sharedCfg(100, 10), t0)
	if err != nil {
		t.Fatal(err)
	}
	d, l := s.Decide(t0, "k", Critical)
	if d.OK || d.Pending == nil || l == nil {
		t.Fatalf("first call: %+v, lease %v; want Pending and a lease", d, l)
	}
	if l.Want != 1 || l.Min != 1 || l.Interval != 10*time.Millisecond || l.Tau != 100*time.Millisecond || l.Horizon != 200*time.Millisecond {
		t.Fatalf("lease %+v: want 1 token, t 10ms, tau 100ms, horizon 2 lease periods", l)
	}
	if d2, l2 := s.Decide(t0, "k", Critical); l2 != nil || d2.Pending != d.Pending {
		t.Fatalf("second call while the lease is in flight: %+v, lease %v; want the same Pending, no new lease", d2, l2)
	}
	st := newFakeStore()
	g, _ := st.lease(0, 0, l)
	if tr := s.Deliver(l, t0.Add(time.Millisecond), g, nil); tr != NoTransition {
		t.Fatalf("Deliver: transition %v", tr)
	}
	select {
	case <-d.Pending:
	default:
		t.Fatal("Pending not closed by Deliver")
	}
	if d, _ := s.Decide(t0.Add(time.Millisecond), "k", Critical); !d.OK {
		t.Fatalf("after the grant: %+v, want admitted", d)
	}
}

// TestSharedFallbackModes: the store fails, the limiter enters fallback
// (once, for the log), decides by its mode without waiting, asks the store
// again only once per probe interval, and leaves fallback on the first
// answer.
func TestSharedFallbackModes(t *testing.T) {
	for _, tt := range []struct {
		mode FallbackMode
		// admitted of 40 calls 1ms apart at 100/s, burst 10, 2 replicas
		// seen: the local share is 50/s with bursts of 5: the burst at
		// 0ms and a token at 20ms
		want int
	}{{FallbackLocalShare, 6}, {FallbackOpen, 40}, {FallbackClosed, 0}} {
		cfg := sharedCfg(100, 10)
		cfg.Fallback = tt.mode
		s, err := NewShared(cfg, t0)
		if err != nil {
			t.Fatal(err)
		}
		// A grant that says two replicas share the key, then an outage.
		_, l := s.Decide(t0, "k", Critical)
		s.Deliver(l, t0, Grant{Tokens: 1, FirstSlot: -time.Second, Replicas: 2, Left: 9}, nil)
		d, l := s.Decide(t0, "k", Critical)
		if !d.OK {
			t.Fatalf("%v: the held token refused", tt.mode)
		}
		if l == nil {
			t.Fatalf("%v: no lease asked once nothing is held", tt.mode)
		}
		if tr := s.Deliver(l, t0, Grant{}, errors.New("connection refused")); tr != EnteredFallback {
			t.Fatalf("%v: transition %v, want EnteredFallback", tt.mode, tr)
		}
		admitted, leases := 0, 0
		for i := range 40 {
			now := t0.Add(time.Duration(i) * time.Millisecond)
			d, l := s.Decide(now, "k", Critical)
			if d.Pending != nil || !d.Fallback {
				t.Fatalf("%v call %d: %+v; want a fallback decision, never a wait on the store", tt.mode, i, d)
			}
			if d.OK {
				admitted++
			} else if tt.mode == FallbackClosed && d.Wait <= 0 {
				t.Fatalf("%v: refused with no wait", tt.mode)
			}
			if l != nil {
				leases++
				s.Deliver(l, now, Grant{}, errors.New("still down"))
			}
		}
		if admitted != tt.want {
			t.Errorf("%v: %d of 40 admitted in fallback, want %d", tt.mode, admitted, tt.want)
		}
		if leases != 0 { // the probe interval (250ms) has not passed
			t.Errorf("%v: %d probes within 40ms, want none before the probe interval", tt.mode, leases)
		}
		now := t0.Add(250 * time.Millisecond)
		_, l = s.Decide(now, "k", Critical)
		if l == nil {
			t.Fatalf("%v: no probe after the probe interval", tt.mode)
		}
		if tr := s.Deliver(l, now, Grant{Tokens: 5, Replicas: 2}, nil); tr != LeftFallback || s.InFallback() {
			t.Fatalf("%v: the store answered: transition %v, in fallback %v", tt.mode, tr, s.InFallback())
		}
	}
}

// TestSharedExpireEntersFallback: a store that does not answer within the
// caller's wait is given up on (Expire): the calls stop waiting and use
// the fallback; the late answer's tokens are still held.
func TestSharedExpireEntersFallback(t *testing.T) {
	s, _ := NewShared(sharedCfg(100, 10), t0)
	d, l := s.Decide(t0, "k", Critical)
	if d.Pending == nil {
		t.Fatal("no Pending")
	}
	if tr := s.Expire(t0.Add(50 * time.Millisecond)); tr != EnteredFallback {
		t.Fatalf("Expire: %v", tr)
	}
	// The local share (one replica: the whole rate) starts empty, and
	// admits one call per interval (10ms).
	if d, _ := s.Decide(t0.Add(50*time.Millisecond), "k", Critical); d.Pending != nil || !d.Fallback || d.OK || d.Wait != 10*time.Millisecond {
		t.Fatalf("after Expire: %+v; want a fallback decision, refused for one interval (10ms), no wait on the store", d)
	}
	if d, _ := s.Decide(t0.Add(60*time.Millisecond), "k", Critical); !d.OK || !d.Fallback {
		t.Fatalf("one interval later: %+v; want admitted by the local share", d)
	}
	s.Deliver(l, t0.Add(3*time.Second), Grant{Tokens: 3, FirstSlot: -time.Second, Replicas: 1, Left: 7}, nil)
	if s.InFallback() {
		t.Fatal("still in fallback after the store answered")
	}
	for i := range 3 {
		if d, _ := s.Decide(t0.Add(3*time.Second), "k", Critical); !d.OK || d.Fallback {
			t.Fatalf("held token %d: %+v; want admitted from the late lease", i, d)
		}
	}
}

// TestSharedOutageBoundAndReturn: 4 replicas at 4× load, the store down
// from 3 s to 6 s. In the second the outage starts, the replicas spend
// what they held before they notice (the bound: at most one lease period
// of the rate, 200 calls, over it); then each admits its local share, a
// quarter of the rate, so the total is the rate. When the store is back,
// its full bucket and the local shares until each replica's next probe
// add at most the burst and a probe interval of the rate; within 2 s of
// the store's return the count is exact again.
func TestSharedOutageBoundAndReturn(t *testing.T) {
	c := newCluster(t, 4, sharedCfg(1000, 100), 500*time.Microsecond)
	rng := rand.New(rand.NewPCG(7, 7))
	for r := range 4 {
		c.arrivals(rng, r, "tenant", 1000, 0, 10*time.Second)
	}
	c.push(event{at: int64(3 * time.Second), replica: -1})
	c.push(event{at: int64(6 * time.Second), replica: -2})
	c.run()
	a := c.admitted["tenant"]
	for sec, n := range a {
		switch {
		case sec == 0:
		case sec == 3: // the outage starts
			if n > 1000+200 {
				t.Errorf("second 3 (the store went down): %d admitted, over the bound (the rate and one lease period of it)", n)
			}
		case sec == 4 || sec == 5: // fallback: 4 local shares of 250/s
			if n < 970 || n > 1030 {
				t.Errorf("second %d (store down): %d admitted: the local shares should keep the rate ± 3%%", sec, n)
			}
		case sec == 6: // the store's return: its bucket is full again (the burst), and
			// the replicas still in fallback keep their local shares until
			// their next probe (at most a probe interval of the rate)
			if n > 1000+100+250 {
				t.Errorf("second 6 (the store came back): %d admitted, over the bound (the rate, the burst and a probe interval of the rate)", n)
			}
		default:
			if n < 970 || n > 1030 {
				t.Errorf("second %d: %d admitted, want 1000 ± 3%%", sec, n)
			}
		}
	}
	t.Logf("per second %v; %d decided by the fallback", a, c.fallback)
}

// TestSharedReplicaKilled: one of 4 replicas stops at 4 s; the others take
// its share within one lease period: the quota it held when it died (its
// leases reach at most a lease period, 200ms, ahead) is lost, and the
// next second is exact again.
func TestSharedReplicaKilled(t *testing.T) {
	c := newCluster(t, 4, sharedCfg(1000, 100), 500*time.Microsecond)
	rng := rand.New(rand.NewPCG(8, 8))
	for r, share := range []float64{0.7, 0.1, 0.1, 0.1} {
		c.arrivals(rng, r, "tenant", 4000*share, 0, 8*time.Second)
	}
	c.push(event{at: int64(4 * time.Second), replica: -3}) // kill replica 0, the busiest
	c.run()
	a := c.admitted["tenant"]
	if a[4] < 1000-200-30 {
		t.Errorf("second 4, replica 0 died at its start: %d admitted; it can have taken at most a lease period (200 tokens) with it", a[4])
	}
	for sec := 5; sec < 8; sec++ {
		if n := a[sec]; n < 970 || n > 1030 {
			t.Errorf("second %d after replica 0 died: %d admitted, want 1000 ± 3%% (the others at 1,200/s offered)", sec, n)
		}
	}
	t.Logf("per second %v", a)
}

// TestSharedSheddableYieldsUnderExcess: with the store's bucket empty
// (the key saturated), Sheddable calls are refused while Critical ones
// take the tokens as they come; with a full bucket, Sheddable calls pass.
func TestSharedSheddableYieldsUnderExcess(t *testing.T) {
	c := newCluster(t, 2, sharedCfg(1000, 100), 500*time.Microsecond)
	rng := rand.New(rand.NewPCG(9, 9))
	c.arrivals(rng, 0, "tenant", 3000, 0, 3*time.Second)
	c.run()
	s := c.replicas[0]
	now := t0.Add(3 * time.Second)
	shed := 0
	for i := range 100 {
		d, l := s.Decide(now.Add(time.Duration(i)*100*time.Microsecond), "tenant", Sheddable)
		if d.OK {
			shed++
		}
		if l != nil {
			g, err := c.store.lease(int64(3*time.Second)+int64(i)*int64(100*time.Microsecond), 0, l)
			s.Deliver(l, now.Add(time.Duration(i)*100*time.Microsecond), g, err)
		}
	}
	if shed > 0 {
		t.Errorf("%d Sheddable calls admitted on a saturated key, want none: the reserve is half the burst", shed)
	}
	quiet, _ := NewShared(sharedCfg(1000, 100), t0)
	d, l := quiet.Decide(t0, "tenant", Sheddable)
	g, _ := newFakeStore().lease(0, 0, l)
	quiet.Deliver(l, t0, g, nil)
	if d, _ = quiet.Decide(t0, "tenant", Sheddable); !d.OK {
		t.Errorf("Sheddable on a quiet key (the store's bucket full): %+v, want admitted", d)
	}
}

// TestSharedKeysBoundAndSweep: at MaxKeys, a new key takes the place of one
// that holds nothing (no lease held or in flight, its demand old), and
// shares the overflow bucket while none does.
func TestSharedKeysBoundAndSweep(t *testing.T) {
	cfg := sharedCfg(1000, 10)
	cfg.MaxKeys = 2
	s, _ := NewShared(cfg, t0)
	st := newFakeStore()
	call := func(at time.Duration, key string) SharedDecision {
		d, l := s.Decide(t0.Add(at), key, Critical)
		if l != nil {
			g, _ := st.lease(int64(at), 0, l)
			s.Deliver(l, t0.Add(at), g, nil)
		}
		return d
	}
	call(0, "a")
	call(0, "b")
	call(0, "c") // the bound: c shares the overflow bucket
	if got := s.Keys(); got != 2 {
		t.Fatalf("%d keys remembered at the bound of 2", got)
	}
	// Much later, a and b hold nothing: their leases ended, their demand
	// is old. A new key takes a place.
	call(10*time.Second, "d")
	s.keys.mu.Lock()
	found := s.keys.tab.Load().find(maphashOf(s, "d"), "d") != nil
	s.keys.mu.Unlock()
	if !found {
		t.Fatal(`key "d" not remembered after the idle keys were forgotten`)
	}
}

func maphashOf(s *Shared, key string) uint64 { return maphash.String(s.keys.seed, key) | 1 }

// TestSharedConcurrent races decisions on a few keys with deliveries from
// other goroutines (a store answering asynchronously), on a small key
// bound; it ends with no lease left in flight.
func TestSharedConcurrent(t *testing.T) {
	cfg := sharedCfg(1e5, 100)
	cfg.MaxKeys = 4
	s, _ := NewShared(cfg, t0)
	var mu sync.Mutex
	st := newFakeStore()
	var wg sync.WaitGroup
	var clock atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				n := clock.Add(int64(10 * time.Microsecond))
				d, l := s.Decide(t0.Add(time.Duration(n)), "k"+strconv.Itoa((g+i)%6), Criticality(i%4))
				if l != nil {
					wg.Go(func() {
						mu.Lock()
						gr, err := st.lease(n, g, l)
						mu.Unlock()
						s.Deliver(l, t0.Add(time.Duration(clock.Load())), gr, err)
					})
				}
				if d.Pending != nil {
					<-d.Pending
				}
			}
		})
	}
	wg.Wait()
	for _, tab := range []*table[sharedKey]{s.keys.tab.Load()} {
		for i := range tab.slots {
			if e := tab.slots[i].e.Load(); e != nil {
				e.v.mu.Lock()
				if e.v.fetch != nil {
					t.Errorf("key %q: a lease left in flight", e.key)
				}
				e.v.mu.Unlock()
			}
		}
	}
}

// TestSharedRefund: a token given back goes to the held lease, and the
// next call takes it.
func TestSharedRefund(t *testing.T) {
	s, _ := NewShared(sharedCfg(10, 1), t0)
	_, l := s.Decide(t0, "k", Critical)
	s.Deliver(l, t0, Grant{Tokens: 2, FirstSlot: 0, Replicas: 1}, nil)
	if d, _ := s.Decide(t0, "k", Critical); !d.OK {
		t.Fatal("the first held token refused")
	}
	if d, _ := s.Decide(t0, "k", Critical); d.OK || d.Wait != 100*time.Millisecond {
		t.Fatalf("the second token's slot is 100ms on: %+v", d)
	}
	s.Refund(t0, "k")
	if d, _ := s.Decide(t0, "k", Critical); !d.OK {
		t.Fatal("the refunded token refused")
	}
}

// TestSharedReserveWaitIsNeverZero: a Sheddable call refused for the
// reserve while a token is there is told to come back when the reserve
// can be met, never after 0 (a client would come back at once).
func TestSharedReserveWaitIsNeverZero(t *testing.T) {
	s, _ := NewShared(sharedCfg(10, 11), t0) // Sheddable keeps 5 of the burst above one
	_, l := s.Decide(t0, "k", Critical)
	s.Deliver(l, t0, Grant{Tokens: 3, FirstSlot: -time.Second, Replicas: 1, Left: 0}, nil)
	d, _ := s.Decide(t0, "k", Sheddable)
	if d.OK || d.Wait <= 0 {
		t.Fatalf("Sheddable with 3 tokens held, the store empty, a reserve of 5: %+v; want refused with a wait", d)
	}
	if d, _ := s.Decide(t0, "k", Critical); !d.OK {
		t.Fatalf("Critical refused a held token: %+v", d)
	}
}

// TestSharedClosedFallbackWaitIsNeverZero: in FallbackClosed, a call
// refused while the probe of the store is in flight past its time (the
// store hangs; the probe waits out the caller's lease timeout, which may be
// longer than the probe interval) is told to come back after a probe
// interval, never after 0 (a client would come back at once, in a loop,
// for as long as the store hangs). Before, the wait was the time until
// the probe's instant, which had passed: 0.
func TestSharedClosedFallbackWaitIsNeverZero(t *testing.T) {
	cfg := sharedCfg(100, 10)
	cfg.Fallback = FallbackClosed
	s, _ := NewShared(cfg, t0)
	_, l := s.Decide(t0, "k", Critical)
	if tr := s.Deliver(l, t0, Grant{}, errors.New("connection refused")); tr != EnteredFallback {
		t.Fatalf("transition %v, want EnteredFallback", tr)
	}
	at := t0.Add(DefaultProbeInterval)
	d, probe := s.Decide(at, "k", Critical)
	if probe == nil || d.OK || d.Wait <= 0 {
		t.Fatalf("at the probe's instant: %+v, probe %v; want a probe sent and the call refused with a wait", d, probe != nil)
	}
	for _, after := range []time.Duration{DefaultProbeInterval, time.Second} { // the probe hangs
		d, l := s.Decide(at.Add(after), "k", Critical)
		if l != nil || d.OK || !d.Fallback || d.Wait <= 0 {
			t.Fatalf("%v after a probe still in flight: %+v, another lease %v; want refused by the fallback with a wait > 0", after, d, l != nil)
		}
	}
	s.Deliver(probe, at.Add(2*time.Second), Grant{}, errors.New("i/o timeout"))
	if d, l := s.Decide(at.Add(2*time.Second), "k", Critical); l == nil || d.Wait <= 0 {
		t.Fatalf("after the hung probe failed: %+v, probe %v; want the next probe at once and a wait", d, l != nil)
	}
}

// overflowKey is the fake store's bucket of the overflow leases: no key a
// test decides.
const overflowKey = "\x00overflow"

// TestSharedOverflowKeysShareOneBucketInTheStore pins REVIEW class "a
// cache keyed by caller input" for a shared limit: the keys beyond MaxKeys
// share one bucket, and its leases draw on one bucket of the store, apart
// from every key's. Before, an overflow lease asked for the tokens of
// whichever key was being decided, so a caller naming a new key each call
// drew on a fresh, full bucket of the store every lease, past the rate, and
// spent tokens of real keys' buckets that it happened to name.
func TestSharedOverflowKeysShareOneBucketInTheStore(t *testing.T) {
	cfg := sharedCfg(1, 5) // one token a second, bursts of 5
	cfg.MaxKeys = 1
	s, _ := NewShared(cfg, t0)
	st := newFakeStore()
	admitted := 0
	for i := range 50 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		key := "k" + strconv.Itoa(i) // k0 is remembered; the others overflow
		for {
			d, l := s.Decide(at, key, Critical)
			if l != nil {
				if i > 0 && (!l.Overflow || l.Key != "") {
					t.Fatalf("call %d: lease %+v for an overflow key, want Overflow and no key", i, l)
				}
				g, err := st.lease(int64(at.Sub(t0)), 0, l)
				s.Deliver(l, at, g, err)
			}
			if d.Pending != nil {
				continue // decide again with the lease delivered
			}
			if d.OK && i > 0 {
				admitted++
			}
			break
		}
	}
	if admitted > 5 {
		t.Errorf("%d of 49 calls on overflow keys admitted within 50ms at 1/s, bursts of 5: want at most the burst", admitted)
	}
	for k := range st.tat {
		if k != "k0" && k != overflowKey {
			t.Errorf("the store holds a bucket for the overflow key %q", k)
		}
	}
}
