package admin

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func refusal(source, subject, reason, tenant string) *event {
	return &event{key: partKey{side: sideServer, source: source, part: adminv1.Part_PART_LIMIT, subject: subject},
		kind: adminv1.EventKind_EVENT_KIND_REFUSED, reason: reason, tenant: tenant, cause: "shed"}
}

// TestEventLogIsBoundedUnderAFlood floods the log with 200,000 events:
// transitions and refusals on 5,000 parts of 40 sources, with long strings
// and many failures, and refusals of a new tenant each (one event each).
// The log keeps at most eventsPerPart events of each of maxParts parts and
// maxOverflowParts overflow parts, every string cut to maxText bytes, every
// event at most maxFailures failures, so the bytes it holds are within the
// bound those make; and it counts what it let go.
func TestEventLogIsBoundedUnderAFlood(t *testing.T) {
	clk := newFakeClock()
	l := newEventLog(clk.now)
	long := strings.Repeat("é", maxText) // 2 bytes a rune: cut on a rune boundary
	fails := make([]failure, 100)
	const sources = 40
	n := 200_000
	if testing.Short() || raceEnabled {
		n = 50_000
	}
	// perEvent is the most one event may hold: five strings (source,
	// subject, cause, tenant, method) and its failures, counted at the size
	// of a failure.
	failureSize := int(unsafe.Sizeof(failure{}))
	perEvent := 5*maxText + maxFailures*failureSize
	for i := range n {
		src := "s" + strconv.Itoa(i%sources)
		subject := strconv.Itoa(i%5000) + long
		if i%2 == 0 {
			l.add(&event{key: partKey{side: sideClient, source: src, part: adminv1.Part_PART_BREAKER, subject: subject},
				kind: adminv1.EventKind_EVENT_KIND_BREAKER_STATE, cause: long, fails: fails})
		} else {
			l.refuse(refusal(src, subject, "limit", strconv.Itoa(i)+long), clk.now())
		}
		clk.add(time.Microsecond)
	}
	events, bytes := 0, 0
	l.mu.Lock()
	for _, r := range l.parts {
		for i := range r.n {
			e := r.newest(i)
			events++
			bytes += len(e.cause) + len(e.key.subject) + len(e.tenant) + len(e.method) + len(e.key.source) + failureSize*len(e.fails)
			if len(e.cause) > maxText || len(e.key.subject) > maxText || len(e.tenant) > maxText || len(e.fails) > maxFailures {
				t.Fatalf("event %d holds %d, %d, %d bytes and %d failures: over the bounds", e.seq, len(e.cause), len(e.key.subject), len(e.tenant), len(e.fails))
			}
		}
	}
	parts := len(l.parts)
	l.mu.Unlock()
	mostEvents := (maxParts + maxOverflowParts) * eventsPerPart
	if events > mostEvents || parts > maxParts+maxOverflowParts {
		t.Errorf("after %d events: %d kept in %d parts, want at most %d in %d", n, events, parts, mostEvents, maxParts+maxOverflowParts)
	}
	if most := mostEvents * perEvent; bytes > most {
		t.Errorf("the log holds %d bytes of strings and failures, want at most %d", bytes, most)
	}
	list, dropped := l.list(0, 0)
	if len(list) != events || dropped != uint64(n-events) {
		t.Errorf("list has %d events, %d dropped; want %d and %d", len(list), dropped, events, n-events)
	}
	t.Logf("%d events kept in %d parts, %d bytes of strings and failures (bound %d); %d dropped", events, parts, bytes, mostEvents*perEvent, dropped)
}

// overShare is a refusal of a tenant over its fair share.
func overShare(tenant string) *event {
	e := refusal("api", "(server)", "limit", tenant)
	e.over = true
	return e
}

// TestRefusalsCoalesceIntoEpisodes: refusals of one part, reason, method,
// criticality and tenant within episodeGap of the last are one event whose
// count and last time grow; after a gap, or from another tenant over its
// share, a new event begins.
func TestRefusalsCoalesceIntoEpisodes(t *testing.T) {
	clk := newFakeClock()
	l := newEventLog(clk.now)
	start := clk.now()
	for range 100 {
		l.refuse(overShare("a"), clk.now())
		clk.add(episodeGap / 2) // each within the gap of the one before
	}
	l.refuse(overShare("b"), clk.now())
	clk.add(episodeGap)
	l.refuse(overShare("a"), clk.now())
	got, _ := l.list(0, 0)
	if len(got) != 3 {
		t.Fatalf("%d events, want 3 (tenant a's episode, b's, a's next): %v", len(got), got)
	}
	a := got[0]
	if a.GetCount() != 100 || !a.GetTime().AsTime().Equal(start) || !a.GetLastTime().AsTime().Equal(start.Add(99*episodeGap/2)) || a.GetTenant() != "a" {
		t.Errorf("first episode = count %d from %v to %v (tenant %q), want 100 refusals of tenant a over 49.5 gaps",
			a.GetCount(), a.GetTime().AsTime(), a.GetLastTime().AsTime(), a.GetTenant())
	}
	if got[1].GetTenant() != "b" || got[1].GetCount() != 1 || got[2].GetTenant() != "a" || got[2].GetCount() != 1 {
		t.Errorf("then %v and %v, want one refusal of b, then a new episode of a", got[1], got[2])
	}
}

// TestEventsAfterASequence: list after a sequence returns the newer
// events, and max keeps the newest.
func TestEventsAfterASequence(t *testing.T) {
	l := newEventLog(newFakeClock().now)
	for i := range 10 {
		l.add(&event{key: partKey{side: sideClient, source: "c", part: adminv1.Part_PART_BREAKER, subject: strconv.Itoa(i)},
			kind: adminv1.EventKind_EVENT_KIND_BREAKER_STATE})
	}
	seqs := func(es []*adminv1.Event) (out []uint64) {
		for _, e := range es {
			out = append(out, e.GetSequence())
		}
		return out
	}
	if got, _ := l.list(7, 0); len(got) != 3 || got[0].GetSequence() != 8 {
		t.Errorf("list(7, 0) = %v, want 8, 9, 10", seqs(got))
	}
	if got, _ := l.list(0, 2); len(got) != 2 || got[0].GetSequence() != 9 {
		t.Errorf("list(0, 2) = %v, want 9, 10", seqs(got))
	}
}

// TestCutKeepsRunesWhole: a cut string is valid UTF-8 and at most maxText
// bytes.
func TestCutKeepsRunesWhole(t *testing.T) {
	for _, s := range []string{strings.Repeat("a", 1000), strings.Repeat("日本", 300), "short"} {
		c := cut(s)
		if len(c) > maxText || !strings.HasPrefix(s, strings.TrimSuffix(c, "…")) || !utf8Valid(c) {
			t.Errorf("cut(%.10q…) = %d bytes %.10q…, want ≤ %d bytes, a prefix, valid UTF-8", s, len(c), c, maxText)
		}
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// TestTenantNamesWithinTheirShareMakeOneEpisode: 10,000 refusals, each of
// a new tenant within its share (names a caller chooses), are one event,
// not 10,000: the log cannot be flooded through the tenant header.
func TestTenantNamesWithinTheirShareMakeOneEpisode(t *testing.T) {
	clk := newFakeClock()
	l := newEventLog(clk.now)
	for i := range 10_000 {
		l.refuse(refusal("api", "(server)", "limit", "t"+strconv.Itoa(i)), clk.now())
		clk.add(time.Microsecond)
	}
	got, _ := l.list(0, 0)
	if len(got) != 1 || got[0].GetCount() != 10_000 || got[0].GetTenant() != "t0" {
		t.Errorf("%d events (first %v), want one of 10,000 refusals naming the first tenant", len(got), got[0])
	}
}

// TestAnchoredClockFollowsTheWallClock: the default clock reads within a
// millisecond of time.Now, moves forward, and takes a new anchor after
// anchorFor.
func TestAnchoredClockFollowsTheWallClock(t *testing.T) {
	c := &anchoredClock{}
	prev := c.now()
	for range 1000 {
		before := time.Now()
		got := c.now()
		after := time.Now()
		if got.Before(prev) || got.Before(before.Add(-time.Millisecond)) || got.After(after.Add(time.Millisecond)) {
			t.Fatalf("now() = %v between time.Now() %v and %v (previous %v)", got, before, after, prev)
		}
		prev = got
	}
	old := time.Now().Add(-2 * anchorFor)
	c.anchor.Store(&old)
	if got := c.now(); got.Sub(old) < anchorFor || c.anchor.Load() == &old {
		t.Errorf("after an anchor older than anchorFor, now() = %v from anchor %v: want a new anchor", got, old)
	}
}
