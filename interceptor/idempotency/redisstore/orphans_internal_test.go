package redisstore

import (
	"strconv"
	"testing"
	"time"
)

// TestOrphansBoundedAndUsedOnce pins the documented bounds of the tokens a
// Store remembers after failed Claims: each is taken once, only for its key
// and fingerprint and only before its lease would end; at most maxOrphans
// are kept, room is made by dropping ended ones, never live ones.
func TestOrphansBoundedAndUsedOnce(t *testing.T) {
	var o orphans
	live, ended := time.Now().Add(time.Minute), time.Now().Add(-time.Millisecond)
	if _, ok := o.take("k", []byte("fp")); ok {
		t.Fatal("take() on an empty set = ok, want none")
	}
	o.put("k", []byte("fp"), "t1", live)
	if _, ok := o.take("k", []byte("other")); ok {
		t.Error("take() with another fingerprint = ok, want none")
	}
	if tok, ok := o.take("k", []byte("fp")); !ok || tok != "t1" {
		t.Errorf("take() = %q, %v; want t1, true", tok, ok)
	}
	if _, ok := o.take("k", []byte("fp")); ok {
		t.Error("second take() = ok, want none: a token is used once")
	}
	o.put("k", []byte("fp"), "t2", ended)
	if _, ok := o.take("k", []byte("fp")); ok {
		t.Error("take() after the lease ended = ok, want none")
	}

	for i := range maxOrphans {
		o.put("live-"+strconv.Itoa(i), nil, "t", live)
	}
	o.put("one-more", nil, "t", live)
	if _, ok := o.take("one-more", nil); ok || o.n.Load() != maxOrphans {
		t.Errorf("full of live tokens: the next was kept (%v) or the count is %d, want dropped and %d", ok, o.n.Load(), maxOrphans)
	}
	if _, ok := o.take("live-0", nil); !ok {
		t.Error("a live token was dropped to make room")
	}
	o.put("ended", nil, "t", ended) // fills the set again, with one that has ended
	o.put("after-sweep", nil, "t", live)
	if _, ok := o.take("after-sweep", nil); !ok {
		t.Error("full with an ended token: the next was not kept, want the ended one dropped for it")
	}
}
