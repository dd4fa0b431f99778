package ratelimit

import (
	"container/heap"
	"errors"
	"math/rand/v2"
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
