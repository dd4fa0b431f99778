package admin

import (
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// The bounds of the event log. A process's parts are bounded by its code and
// config (a Client's methods by its own bound, a Server's limits by its
// document), but the log bounds itself anyway: every part keeps its last
// eventsPerPart events, and at most maxParts parts are kept (the parts
// beyond share one overflow part per side and source, and past
// maxOverflowParts of those, one for all), so the log holds at most
// (maxParts+maxOverflowParts) × eventsPerPart events, each with strings
// cut to maxText bytes and at most maxFailures failures.
const (
	eventsPerPart = 16
	maxParts      = 256
	// maxOverflowParts bounds the overflow parts (one per side and
	// source); past it, every part beyond maxParts shares one.
	maxOverflowParts = 16
	maxText          = 256
	maxFailures      = 8
	// episodeGap is how long after a refusal the next one of the same
	// kind still belongs to its episode: a part refusing steadily makes
	// one event whose count grows, not an event per call.
	episodeGap = time.Second
	// overflowSubject is the subject of the part that the parts beyond
	// maxParts share.
	overflowSubject = "(other)"
)

// partKey names a part of one source.
type partKey struct {
	side, source string
	part         adminv1.Part
	subject      string
}

// event is one entry of the log: the Go form of adminv1.Event. Its fields
// are guarded by the log's mutex.
type event struct {
	seq     uint64
	ver     uint64 // the log's version when it last changed
	key     partKey
	kind    adminv1.EventKind
	time    time.Time
	last    time.Time
	count   uint64
	cause   string
	from    string
	to      string
	reason  string
	crit    string
	tenant  string
	tenants int64
	over    bool
	code    string
	method  string
	until   time.Time // zero: none
	fails   []failure
	rkey    string // the key a server's rate limit refused (its episode's)
}

// episode is what makes two refusals one episode: the same part, reason,
// method and criticality, and for a tenant over its fair share, the same
// tenant. Tenants within their share are one episode whatever their names
// (the event keeps the first one's): a caller choosing a new tenant name
// for every call makes no new event, and the tenants over their share at
// once are few (each holds a fair share of the limit).
//
// A server's rate limit's refusals are one episode per key (rkey: the
// tenant, peer or scope it counts by): a key is refused only once it has
// spent its own burst, and the part's ring bounds the events.
type episode struct {
	reason, method, crit, tenant, rkey string
	over                               bool
}

func (e *event) episode() episode {
	ep := episode{reason: e.reason, method: e.method, crit: e.crit, over: e.over, rkey: e.rkey}
	if e.over {
		ep.tenant = e.tenant
	}
	return ep
}

// ring is one part's last events, oldest first from start.
type ring struct {
	buf   [eventsPerPart]*event
	start int
	n     int
}

func (r *ring) push(e *event) (dropped *event) {
	i := (r.start + r.n) % eventsPerPart
	if r.n == eventsPerPart {
		dropped = r.buf[r.start]
		r.start = (r.start + 1) % eventsPerPart
	} else {
		r.n++
	}
	r.buf[i] = e
	return dropped
}

// newest returns the k-th newest event (0 the newest), or nil.
func (r *ring) newest(k int) *event {
	if k >= r.n {
		return nil
	}
	return r.buf[(r.start+r.n-1-k)%eventsPerPart]
}

// eventLog is the bounded log of a View's events. Writers are the parts'
// hooks (on transitions and refusals only, never on a call that
// succeeds); readers copy what they need under the mutex.
type eventLog struct {
	now func() time.Time

	mu      sync.Mutex
	seq     uint64 // of the newest event
	ver     uint64 // bumped by every change, new event or new count
	parts   map[partKey]*ring
	dropped uint64
	// changed is closed and replaced at the first change after a watcher
	// took it (handed is set), so that the changes no one waits for
	// allocate nothing.
	changed chan struct{}
	handed  bool
}

func newEventLog(now func() time.Time) *eventLog {
	return &eventLog{now: now, parts: map[partKey]*ring{}, changed: make(chan struct{})}
}

// ringLocked returns the ring of k, or of its source's overflow part when
// maxParts parts are kept already.
func (l *eventLog) ringLocked(k partKey) *ring {
	if r := l.parts[k]; r != nil {
		return r
	}
	if len(l.parts) >= maxParts {
		k = partKey{side: k.side, source: k.source, part: adminv1.Part_PART_UNSPECIFIED, subject: overflowSubject}
		if r := l.parts[k]; r != nil {
			return r
		}
		if len(l.parts) >= maxParts+maxOverflowParts-1 {
			k = partKey{part: adminv1.Part_PART_UNSPECIFIED, subject: overflowSubject}
			if r := l.parts[k]; r != nil {
				return r
			}
		}
	}
	r := &ring{}
	l.parts[k] = r
	return r
}

// changedLocked bumps the version and wakes the watchers.
func (l *eventLog) changedLocked() {
	l.ver++
	if l.handed {
		close(l.changed)
		l.changed = make(chan struct{})
		l.handed = false
	}
}

// nextLocked returns the channel closed at the next change, for a watcher.
func (l *eventLog) nextLocked() <-chan struct{} {
	l.handed = true
	return l.changed
}

// add appends e, a transition, stamped now, and returns its sequence.
func (l *eventLog) add(e *event) uint64 {
	return l.addAt(e, l.now())
}

// addAt appends e, a transition that happened at t (which a part reported,
// perhaps before the view learnt of it), and returns its sequence.
func (l *eventLog) addAt(e *event, t time.Time) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addLocked(e, t)
}

func (l *eventLog) addLocked(e *event, now time.Time) uint64 {
	clip(e)
	l.seq++
	e.seq, e.time, e.last = l.seq, now, now
	if e.count == 0 {
		e.count = 1
	}
	if l.ringLocked(e.key).push(e) != nil {
		l.dropped++
	}
	l.changedLocked()
	e.ver = l.ver
	return e.seq
}

// bump counts one more refusal at now in the episode ep of kind of part k
// when one is under way (the last refusal within episodeGap), and reports
// whether it did. It allocates nothing: a part refusing steadily costs
// each refused call this, and the caller builds an event only when bump
// finds no episode.
func (l *eventLog) bump(k partKey, kind adminv1.EventKind, ep episode, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bumpLocked(k, kind, ep, now)
}

func (l *eventLog) bumpLocked(k partKey, kind adminv1.EventKind, ep episode, now time.Time) bool {
	r := l.parts[k]
	if r == nil {
		return false
	}
	for i := range r.n {
		old := r.newest(i)
		if old.kind == kind && old.episode() == ep && now.Sub(old.last) < episodeGap {
			old.count++
			old.last = now
			l.changedLocked()
			old.ver = l.ver
			return true
		}
	}
	return false
}

// refuse records a refusal at now: one more in the current episode of its
// part when one is under way (same episode, the last refusal within
// episodeGap), else e as a new event.
func (l *eventLog) refuse(e *event, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bumpLocked(e.key, e.kind, e.episode(), now) {
		return
	}
	l.addLocked(e, now)
}

// latest returns a copy of the newest event of kind for k, or nil.
func (l *eventLog) latest(k partKey, kind adminv1.EventKind) *adminv1.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.parts[k]
	if r == nil {
		return nil
	}
	for i := range r.n {
		if e := r.newest(i); e.kind == kind {
			return toProto(e)
		}
	}
	return nil
}

// list returns the events after seq (all with 0), oldest first, at most
// max of the newest (0: all), with the log's count of dropped events.
func (l *eventLog) list(after uint64, max int) (events []*adminv1.Event, dropped uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	all := l.collectLocked(func(e *event) bool { return e.seq > after })
	if max > 0 && len(all) > max {
		all = all[len(all)-max:]
	}
	out := make([]*adminv1.Event, len(all))
	for i, e := range all {
		out[i] = toProto(e)
	}
	return out, l.dropped
}

// collectLocked returns the events keep selects, in sequence order.
func (l *eventLog) collectLocked(keep func(*event) bool) []*event {
	var out []*event
	for _, r := range l.parts {
		for i := range r.n {
			if e := r.buf[(r.start+i)%eventsPerPart]; keep(e) {
				out = append(out, e)
			}
		}
	}
	sortBySeq(out)
	return out
}

// changes returns the events changed after version ver (new, or with a
// new count), in sequence order, the log's version now, and a channel
// closed at the next change.
func (l *eventLog) changes(ver uint64) (events []*adminv1.Event, now uint64, next <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.collectLocked(func(e *event) bool { return e.ver > ver }) {
		events = append(events, toProto(e))
	}
	return events, l.ver, l.nextLocked()
}

// position returns the log's newest sequence and version.
func (l *eventLog) position() (seq, ver uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq, l.ver
}

// size returns the number of events kept and of parts, for the tests of
// the bounds.
func (l *eventLog) size() (events, parts int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.parts {
		events += r.n
	}
	return events, len(l.parts)
}

func sortBySeq(es []*event) {
	slices.SortFunc(es, func(a, b *event) int {
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
}

// clip cuts e's strings to maxText bytes and its failures to maxFailures,
// the newest kept.
func clip(e *event) {
	for _, s := range []*string{&e.key.subject, &e.cause, &e.tenant, &e.method, &e.key.source} {
		*s = cut(*s)
	}
	if n := len(e.fails); n > maxFailures {
		e.fails = e.fails[n-maxFailures:]
	}
}

// cut returns s cut to at most maxText bytes, on a rune boundary, with
// "…" marking the cut.
func cut(s string) string {
	if len(s) <= maxText {
		return s
	}
	i := maxText - len("…")
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

func toProto(e *event) *adminv1.Event {
	pe := &adminv1.Event{
		Sequence: e.seq, Time: timestamppb.New(e.time), Side: e.key.side, Source: e.key.source, Part: e.key.part,
		Subject: e.key.subject, Kind: e.kind, Cause: e.cause, Count: e.count, LastTime: timestamppb.New(e.last),
		From: e.from, To: e.to, Reason: e.reason, Criticality: e.crit, Tenant: e.tenant, Tenants: e.tenants,
		OverShare: e.over, Code: e.code, FullMethod: e.method,
	}
	if !e.until.IsZero() {
		pe.Until = timestamppb.New(e.until)
	}
	for _, f := range e.fails {
		pe.Failures = append(pe.Failures, f.proto())
	}
	return pe
}

// backlog returns the events after sequence *after (none when after is
// nil), in sequence order, with the log's version and the channel closed
// at its next change, read at one instant: a watcher that starts from
// them misses no change.
func (l *eventLog) backlog(after *uint64) (events []*adminv1.Event, ver uint64, next <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if after != nil {
		for _, e := range l.collectLocked(func(e *event) bool { return e.seq > *after }) {
			events = append(events, toProto(e))
		}
	}
	return events, l.ver, l.nextLocked()
}
