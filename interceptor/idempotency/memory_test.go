package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/storetest"
	"github.com/grpc-resilience/resilience/internal/clock"
)

const testMaxRecord = 4096

// oneScope turns the scope quota off, for the tests of the store's own
// bounds, whose keys are all of one scope.
var oneScope = idempotency.WithScopeQuota(0, 0)

func newTestMemory(t testing.TB, opts ...idempotency.MemoryOption) (*idempotency.MemoryStore, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	opts = append([]idempotency.MemoryOption{idempotency.WithNow(clk.Now), idempotency.WithMaxRecordBytes(testMaxRecord)}, opts...)
	s, err := idempotency.NewMemoryStore(opts...)
	if err != nil {
		t.Fatalf("NewMemoryStore() error = %v", err)
	}
	return s, clk
}

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s, clk := newTestMemory(t)
		q, err := idempotency.NewMemoryStore(idempotency.WithNow(clk.Now), idempotency.WithShards(1),
			idempotency.WithScopeQuota(4, 0))
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Harness{
			Store:          s,
			Advance:        func(_ testing.TB, d time.Duration) { clk.Advance(d) },
			MaxRecordBytes: testMaxRecord,
			QuotaStore:     q,
			QuotaEntries:   4,
		}
	})
}

func TestNewMemoryStoreRejectsBadBounds(t *testing.T) {
	tests := []struct {
		name string
		opts []idempotency.MemoryOption
		want string
	}{
		{"no shards", []idempotency.MemoryOption{idempotency.WithShards(0)}, "shards 0"},
		{"fewer entries than shards", []idempotency.MemoryOption{idempotency.WithMaxEntries(3), idempotency.WithShards(4)}, "max entries 3"},
		{"record bound zero", []idempotency.MemoryOption{idempotency.WithMaxRecordBytes(0)}, "max record bytes 0"},
		{"shard smaller than a record", []idempotency.MemoryOption{idempotency.WithMaxBytes(1 << 20)}, "max bytes 1048576"},
		{"nil clock", []idempotency.MemoryOption{idempotency.WithNow(nil)}, "now"},
		{"negative min retention", []idempotency.MemoryOption{idempotency.WithMinRetention(-time.Second)}, "min retention -1s"},
		{"negative scope quota", []idempotency.MemoryOption{idempotency.WithScopeQuota(-1, 0)}, "scope quota -1 entries"},
		{"scope quota below the shards", []idempotency.MemoryOption{idempotency.WithScopeQuota(8, 0)}, "scope quota 8 entries"},
		{"scope byte quota too small", []idempotency.MemoryOption{idempotency.WithScopeQuota(0, 1000)}, "scope quota 1000 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := idempotency.NewMemoryStore(tt.opts...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewMemoryStore() error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func complete(t *testing.T, s idempotency.Store, k idempotency.RecordKey, reply []byte, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	c, err := s.Claim(ctx, k, []byte("fp"), time.Minute)
	if err != nil || c.State != idempotency.Owned {
		t.Fatalf("Claim(%q) = %v, %v, want Owned", k.Key, c.State, err)
	}
	if err := s.Complete(ctx, k, c.Token, &idempotency.Record{Fingerprint: []byte("fp"), ReplyType: "x.Y", Reply: reply}, ttl); err != nil {
		t.Fatalf("Complete(%q) error = %v", k.Key, err)
	}
}

func stateOf(t *testing.T, s idempotency.Store, k idempotency.RecordKey) idempotency.State {
	t.Helper()
	c, err := s.Claim(context.Background(), k, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatalf("Claim(%q) error = %v", k.Key, err)
	}
	if c.State == idempotency.Owned {
		if err := s.Release(context.Background(), k, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	return c.State
}

func TestMemoryStoreEvictsOldestRecordWhenEntriesFull(t *testing.T) {
	s, _ := newTestMemory(t, idempotency.WithShards(1), idempotency.WithMaxEntries(3), idempotency.WithMinRetention(0), oneScope)
	k := func(i string) idempotency.RecordKey { return idempotency.RecordKey{FullMethod: "/s/m", Key: i} }
	complete(t, s, k("1"), nil, time.Hour)
	complete(t, s, k("2"), nil, time.Hour)
	complete(t, s, k("3"), nil, time.Hour)
	complete(t, s, k("4"), nil, time.Hour) // evicts 1, the oldest
	if got := s.Len(); got != 3 {
		t.Errorf("Len() = %d, want 3", got)
	}
	if got := stateOf(t, s, k("1")); got != idempotency.Owned {
		t.Errorf("oldest record state = %v, want evicted (Owned on claim)", got)
	}
	for _, i := range []string{"3", "4"} {
		if got := stateOf(t, s, k(i)); got != idempotency.Completed {
			t.Errorf("record %s state = %v, want Completed", i, got)
		}
	}
}

func TestMemoryStoreEvictsByBytes(t *testing.T) {
	// One shard of 3 × (4 KiB + overhead): two 3 KiB records fit, a third
	// evicts the first.
	s, _ := newTestMemory(t, idempotency.WithShards(1), idempotency.WithMaxBytes(7000), idempotency.WithMinRetention(0), oneScope)
	k := func(i string) idempotency.RecordKey { return idempotency.RecordKey{FullMethod: "/s/m", Key: i} }
	complete(t, s, k("1"), make([]byte, 3000), time.Hour)
	complete(t, s, k("2"), make([]byte, 3000), time.Hour)
	complete(t, s, k("3"), make([]byte, 3000), time.Hour)
	if got := s.Bytes(); got > 7000 {
		t.Errorf("Bytes() = %d, want at most 7000", got)
	}
	if got := stateOf(t, s, k("1")); got != idempotency.Owned {
		t.Errorf("oldest record state = %v, want evicted", got)
	}
	if got := stateOf(t, s, k("3")); got != idempotency.Completed {
		t.Errorf("newest record state = %v, want Completed", got)
	}
}

func TestMemoryStoreNeverEvictsLiveLeases(t *testing.T) {
	s, clk := newTestMemory(t, idempotency.WithShards(1), idempotency.WithMaxEntries(2), oneScope)
	ctx := context.Background()
	k := func(i string) idempotency.RecordKey { return idempotency.RecordKey{FullMethod: "/s/m", Key: i} }
	for _, i := range []string{"1", "2"} {
		if c, err := s.Claim(ctx, k(i), []byte("fp"), time.Second); err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim(%s) = %v, %v", i, c.State, err)
		}
	}
	if _, err := s.Claim(ctx, k("3"), []byte("fp"), time.Second); !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Claim() with live leases filling the store error = %v, want ErrStoreFull", err)
	}
	clk.Advance(time.Second) // the leases end: expired entries make room lazily
	if c, err := s.Claim(ctx, k("3"), []byte("fp"), time.Second); err != nil || c.State != idempotency.Owned {
		t.Fatalf("Claim() after the leases ended = %v, %v, want Owned", c.State, err)
	}
	if got := s.Len(); got != 1 {
		t.Errorf("Len() = %d, want 1 (expired leases dropped)", got)
	}
}

func TestMemoryStoreClaimDoesNotAllocateForReplay(t *testing.T) {
	s, _ := newTestMemory(t)
	k := idempotency.RecordKey{Scope: "s", FullMethod: "/s/m", Key: "k"}
	complete(t, s, k, []byte("reply"), time.Hour)
	ctx := context.Background()
	fp := []byte("fp")
	allocs := testing.AllocsPerRun(100, func() {
		if c, _ := s.Claim(ctx, k, fp, time.Minute); c.State != idempotency.Completed {
			t.Fatal(c.State)
		}
	})
	if allocs != 0 {
		t.Errorf("Claim() of a completed key allocates %v times, want 0", allocs)
	}
}

func TestRecordMarshalRoundTripsAndIsVersioned(t *testing.T) {
	rec := &idempotency.Record{
		Fingerprint: []byte{1, 2},
		Code:        codes.OK,
		ReplyType:   "resilience.echo.v1.EchoResponse",
		Reply:       []byte{10, 1, 'x'},
		Header:      metadata.MD{"b": {"2"}, "a": {"1", "x"}, "k-bin": {"\x00\xff"}},
		Trailer:     metadata.MD{"t": {"v"}},
	}
	b1, err := rec.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for range 5 { // deterministic, whatever the map order
		b2, _ := rec.MarshalBinary()
		if !bytes.Equal(b1, b2) {
			t.Fatal("MarshalBinary() is not deterministic")
		}
	}
	var got idempotency.Record
	if err := got.UnmarshalBinary(b1); err != nil {
		t.Fatalf("UnmarshalBinary() error = %v", err)
	}
	b3, _ := got.MarshalBinary()
	if !bytes.Equal(b1, b3) {
		t.Errorf("round trip changed the record: %+v", got)
	}
	// Version 2 is refused. Field 1 (format_version), varint 2.
	if err := got.UnmarshalBinary(append([]byte{0x08, 0x02}, b1[2:]...)); !errors.Is(err, idempotency.ErrUnknownFormat) {
		t.Errorf("UnmarshalBinary(version 2) error = %v, want ErrUnknownFormat", err)
	}
}

func TestMemoryStoreKeepsKeysApartOnHashCollisions(t *testing.T) {
	// Every key hashes alike: one shard, one chain. Keys must still be told
	// apart by their full value, and removing any link (head, middle, tail)
	// must keep the others reachable.
	s, clk := newTestMemory(t, idempotency.WithShards(1), idempotency.WithMaxEntries(4), idempotency.WithMinRetention(0), oneScope)
	idempotency.SetHash(s, func(idempotency.RecordKey) uint64 { return 42 })
	ctx := context.Background()
	k := func(i string) idempotency.RecordKey { return idempotency.RecordKey{FullMethod: "/s/m", Key: i} }
	tokens := map[string]string{}
	for _, i := range []string{"1", "2", "3"} {
		c, err := s.Claim(ctx, k(i), []byte("fp"+i), time.Minute)
		if err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim(%s) = %v, %v, want Owned", i, c.State, err)
		}
		tokens[i] = c.Token
	}
	for _, i := range []string{"1", "2", "3"} {
		if c, _ := s.Claim(ctx, k(i), []byte("fp"+i), time.Minute); c.State != idempotency.InProgress {
			t.Errorf("Claim(%s) again = %v, want InProgress", i, c.State)
		}
		if c, _ := s.Claim(ctx, k(i), []byte("other"), time.Minute); c.State != idempotency.Mismatch {
			t.Errorf("Claim(%s) with another fingerprint = %v, want Mismatch", i, c.State)
		}
	}
	if err := s.Complete(ctx, k("2"), tokens["1"], &idempotency.Record{}, time.Hour); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Complete(2) with the token of 1: error = %v, want ErrNotOwner", err)
	}
	if err := s.Complete(ctx, k("2"), tokens["2"], &idempotency.Record{Reply: []byte("r2")}, time.Hour); err != nil {
		t.Fatalf("Complete(2) error = %v", err)
	}
	if err := s.Release(ctx, k("2"), tokens["2"]); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Release(2) after Complete: error = %v, want ErrNotOwner", err)
	}
	// The chain is 3 -> 2 -> 1 (newest first): drop the head, then the
	// tail, checking the others each time.
	for _, step := range []struct {
		release string
		left    map[string]idempotency.State
	}{
		{"", map[string]idempotency.State{"1": idempotency.InProgress, "2": idempotency.Completed, "3": idempotency.InProgress}},
		{"3", map[string]idempotency.State{"1": idempotency.InProgress, "2": idempotency.Completed}},
		{"1", map[string]idempotency.State{"2": idempotency.Completed}},
	} {
		if step.release != "" {
			if err := s.Release(ctx, k(step.release), tokens[step.release]); err != nil {
				t.Fatalf("Release(%s) error = %v", step.release, err)
			}
		}
		for i, want := range step.left {
			if c, _ := s.Claim(ctx, k(i), []byte("fp"+i), time.Minute); c.State != want {
				t.Errorf("after releasing %q: Claim(%s) = %v, want %v", step.release, i, c.State, want)
			}
		}
	}
	if got := s.Len(); got != 1 {
		t.Errorf("Len() = %d, want 1", got)
	}
	// Fill the shard with colliding records and let eviction and expiry
	// unlink them from the chain.
	for _, i := range []string{"4", "5", "6", "7", "8"} {
		complete(t, s, k(i), []byte(i), time.Hour)
	}
	if got := s.Len(); got != 4 {
		t.Errorf("Len() after evictions = %d, want 4", got)
	}
	for _, i := range []string{"5", "6", "7", "8"} {
		c, _ := s.Claim(ctx, k(i), []byte("fp"), time.Minute)
		if c.State != idempotency.Completed || string(replyOf(c)) != i {
			t.Errorf("Claim(%s) = %v, reply %q, want Completed with %q", i, c.State, replyOf(c), i)
		}
	}
	// The first of these claims evicts the oldest record, 5, to make room;
	// each releases.
	for _, i := range []string{"2", "4"} {
		if got := stateOf(t, s, k(i)); got != idempotency.Owned {
			t.Errorf("evicted record %s: state %v, want Owned (absent)", i, got)
		}
	}
	// The chain is 8 -> 7 -> 6: expiry drops the middle, the tail, the head.
	clk.Advance(time.Hour)
	for _, i := range []string{"7", "6", "8"} {
		if got := stateOf(t, s, k(i)); got != idempotency.Owned {
			t.Errorf("expired record %s: state %v, want Owned (absent)", i, got)
		}
	}
	if got, gotBytes := s.Len(), s.Bytes(); got != 0 || gotBytes != 0 {
		t.Errorf("Len(), Bytes() = %d, %d, want 0, 0", got, gotBytes)
	}
}

func replyOf(c idempotency.Claim) []byte {
	if c.Record == nil {
		return nil
	}
	return c.Record.Reply
}

func TestMemoryStoreFirstExecutionDoesNotAllocate(t *testing.T) {
	// Full, so that every claim evicts the oldest record: the steady state.
	// Owner tokens come from chunks of 256, so 100 runs stay under one
	// allocation each.
	s, _ := newTestMemory(t, idempotency.WithMaxEntries(64), idempotency.WithShards(4), idempotency.WithMinRetention(0), oneScope)
	ctx := context.Background()
	keys := make([]idempotency.RecordKey, 1000)
	for i := range keys {
		keys[i] = idempotency.RecordKey{Scope: "s", FullMethod: "/s/m", Key: "k" + strconv.Itoa(i)}
	}
	fp := bytes.Repeat([]byte{7}, 32)
	rec := &idempotency.Record{Fingerprint: fp, ReplyType: "x.Y", Reply: []byte("reply")}
	i := 0
	first := func() {
		c, err := s.Claim(ctx, keys[i], fp, time.Minute)
		if err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim() = %v, %v", c.State, err)
		}
		if err := s.Complete(ctx, keys[i], c.Token, rec, time.Hour); err != nil {
			t.Fatal(err)
		}
		i++
	}
	for range 500 {
		first()
	}
	if allocs := testing.AllocsPerRun(100, first); allocs != 0 {
		t.Errorf("Claim() and Complete() of a new key allocate %v times, want 0", allocs)
	}
}

// TestMemoryStoreMinRetentionRefusesInsteadOfEvicting pins finding 1 of
// issue 14 in the store: a full shard whose records are all younger than the
// minimum retention refuses the claim, with a hint, instead of evicting one;
// once the oldest passes it, a claim evicts it and counts the eviction.
func TestMemoryStoreMinRetentionRefusesInsteadOfEvicting(t *testing.T) {
	s, clk := newTestMemory(t, idempotency.WithShards(1), idempotency.WithMaxEntries(3), idempotency.WithMinRetention(time.Minute), oneScope)
	k := func(i string) idempotency.RecordKey { return idempotency.RecordKey{FullMethod: "/s/m", Key: i} }
	complete(t, s, k("1"), nil, time.Hour)
	clk.Advance(10 * time.Second)
	complete(t, s, k("2"), nil, time.Hour)
	complete(t, s, k("3"), nil, time.Hour)
	_, err := s.Claim(context.Background(), k("4"), []byte("fp"), time.Minute)
	var full *idempotency.FullError
	if !errors.As(err, &full) || !errors.Is(err, idempotency.ErrStoreFull) || errors.Is(err, idempotency.ErrScopeFull) || full.Scope {
		t.Fatalf("Claim() into a shard of young records: error = %v, want a *FullError of the store", err)
	}
	// The hint is when the oldest record passes its minimum retention.
	if want := 50 * time.Second; full.RetryAfter != want {
		t.Errorf("RetryAfter = %v, want %v", full.RetryAfter, want)
	}
	for _, i := range []string{"1", "2", "3"} {
		if got := stateOf(t, s, k(i)); got != idempotency.Completed {
			t.Errorf("record %s = %v, want Completed (kept)", i, got)
		}
	}
	if st := s.Stats(); st.Evicted != 0 || st.Refused != 1 || st.Entries != 3 {
		t.Errorf("Stats() = %+v, want 3 entries, 0 evicted, 1 refused", st)
	}
	clk.Advance(50 * time.Second)
	if c, err := s.Claim(context.Background(), k("4"), []byte("fp"), time.Minute); err != nil || c.State != idempotency.Owned {
		t.Fatalf("Claim() once the oldest record is a minute old = %v, %v, want Owned", c.State, err)
	}
	for _, i := range []string{"2", "3"} {
		if got := stateOf(t, s, k(i)); got != idempotency.Completed {
			t.Errorf("record %s = %v, want Completed (kept)", i, got)
		}
	}
	if st := s.Stats(); st.Evicted != 1 || st.Entries != 3 {
		t.Errorf("Stats() = %+v, want 3 entries (2, 3 and 4; 1 evicted), 1 evicted", st)
	}
}

// TestMemoryStoreScopeQuotaTouchesOnlyItsScope: a scope at its quota is
// refused (ErrScopeFull, with a hint) while other scopes claim; past the
// minimum retention it evicts its own oldest record, never another's.
func TestMemoryStoreScopeQuotaTouchesOnlyItsScope(t *testing.T) {
	s, clk := newTestMemory(t, idempotency.WithShards(1), idempotency.WithMaxEntries(10),
		idempotency.WithScopeQuota(2, 0), idempotency.WithMinRetention(time.Minute))
	k := func(scope, i string) idempotency.RecordKey {
		return idempotency.RecordKey{Scope: scope, FullMethod: "/s/m", Key: i}
	}
	complete(t, s, k("a", "1"), nil, time.Hour)
	complete(t, s, k("b", "1"), nil, time.Hour)
	complete(t, s, k("b", "2"), nil, time.Hour)
	_, err := s.Claim(context.Background(), k("b", "3"), []byte("fp"), time.Minute)
	var full *idempotency.FullError
	if !errors.As(err, &full) || !full.Scope || !errors.Is(err, idempotency.ErrScopeFull) || !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Claim() past the scope's quota: error = %v, want a *FullError of the scope", err)
	}
	if full.RetryAfter != time.Minute {
		t.Errorf("RetryAfter = %v, want %v", full.RetryAfter, time.Minute)
	}
	complete(t, s, k("a", "2"), nil, time.Hour) // another scope is not refused
	clk.Advance(time.Minute)
	complete(t, s, k("b", "3"), nil, time.Hour) // evicts b/1, b's oldest
	want := map[idempotency.RecordKey]idempotency.State{
		k("a", "1"): idempotency.Completed, k("a", "2"): idempotency.Completed,
		k("b", "2"): idempotency.Completed, k("b", "3"): idempotency.Completed,
	}
	for key, w := range want {
		if got := stateOf(t, s, key); got != w {
			t.Errorf("%s/%s = %v, want %v", key.Scope, key.Key, got, w)
		}
	}
	if st := s.Stats(); st.Evicted != 1 || st.Refused != 1 || st.Entries != 4 {
		t.Errorf("Stats() = %+v, want 4 entries (b/1 evicted), 1 evicted, 1 refused", st)
	}
}

// TestMemoryStoreCompleteStoresPastTheBoundRatherThanRunAgain: an owner's
// outcome is stored even when the young records leave no room (refusing it
// would make the duplicate run the handler again); the next claim is
// refused until room comes.
func TestMemoryStoreCompleteStoresPastTheBoundRatherThanRunAgain(t *testing.T) {
	// Two records of 3000 bytes (about 3,550 counted) fit in 7,500; a third
	// claim fits, its record does not.
	s, _ := newTestMemory(t, idempotency.WithShards(1), idempotency.WithMaxBytes(7500), idempotency.WithMinRetention(time.Minute), oneScope)
	k := func(i string) idempotency.RecordKey { return idempotency.RecordKey{FullMethod: "/s/m", Key: i} }
	complete(t, s, k("1"), make([]byte, 3000), time.Hour)
	complete(t, s, k("2"), make([]byte, 3000), time.Hour)
	complete(t, s, k("3"), make([]byte, 3000), time.Hour)
	for _, i := range []string{"1", "2", "3"} {
		if got := stateOf(t, s, k(i)); got != idempotency.Completed {
			t.Errorf("record %s = %v, want Completed", i, got)
		}
	}
	if _, err := s.Claim(context.Background(), k("4"), []byte("fp"), time.Minute); !errors.Is(err, idempotency.ErrStoreFull) {
		t.Errorf("Claim() over the byte bound: error = %v, want ErrStoreFull", err)
	}
}

// TestMemoryStoreCompleteAfterLeaseEndedKeepsTheScopeQuota: an owner whose
// lease ended stores its outcome only if its scope has room, as a claim
// would; a caller cannot grow its scope past the quota by letting its
// leases end before completing.
func TestMemoryStoreCompleteAfterLeaseEndedKeepsTheScopeQuota(t *testing.T) {
	s, clk := newTestMemory(t, idempotency.WithShards(1), idempotency.WithMaxEntries(10),
		idempotency.WithScopeQuota(2, 0), idempotency.WithMinRetention(time.Minute))
	ctx := context.Background()
	k := func(i string) idempotency.RecordKey {
		return idempotency.RecordKey{Scope: "b", FullMethod: "/s/m", Key: i}
	}
	c, err := s.Claim(ctx, k("1"), []byte("fp"), time.Second)
	if err != nil || c.State != idempotency.Owned {
		t.Fatalf("Claim(1) = %v, %v, want Owned", c.State, err)
	}
	clk.Advance(2 * time.Second) // the lease of b/1 ends
	complete(t, s, k("2"), nil, time.Hour)
	complete(t, s, k("3"), nil, time.Hour) // drops b/1's ended lease: the quota is full of young records
	err = s.Complete(ctx, k("1"), c.Token, &idempotency.Record{Fingerprint: []byte("fp"), ReplyType: "x.Y"}, time.Hour)
	if !errors.Is(err, idempotency.ErrScopeFull) {
		t.Fatalf("Complete(1) after its lease ended, scope full: error = %v, want ErrScopeFull", err)
	}
	if st := s.Stats(); st.Entries != 2 {
		t.Errorf("Stats().Entries = %d, want 2: the scope's quota", st.Entries)
	}
}

// TestMemoryStoreCompleteEvictsItsOwnScopeFirst: a scope over its quota
// that completes a record makes room by evicting its own records past
// the minimum retention before the store's bound evicts anyone's. Complete
// made room in the store first (its oldest record past the minimum
// retention, whoever's), then in the scope: a flooding tenant's record
// evicted another tenant's, older, record although evicting its own made
// room for both bounds; a claim (scope first, then the store) did not.
func TestMemoryStoreCompleteEvictsItsOwnScopeFirst(t *testing.T) {
	// Records of 3000 bytes (about 3,550 counted): the store holds three,
	// a scope two.
	s, clk := newTestMemory(t, idempotency.WithShards(1), idempotency.WithMaxBytes(11000),
		idempotency.WithScopeQuota(0, 7500), idempotency.WithMinRetention(time.Minute))
	k := func(scope, i string) idempotency.RecordKey {
		return idempotency.RecordKey{Scope: scope, FullMethod: "/s/m", Key: i}
	}
	complete(t, s, k("victim", "1"), make([]byte, 3000), time.Hour)
	clk.Advance(time.Second)
	complete(t, s, k("flooder", "1"), make([]byte, 3000), time.Hour)
	complete(t, s, k("flooder", "2"), make([]byte, 3000), time.Hour)
	clk.Advance(2 * time.Minute) // every record is past the minimum retention
	complete(t, s, k("flooder", "3"), make([]byte, 3000), time.Hour)
	// In this order: stateOf claims a key it finds absent.
	for _, w := range []struct {
		key   idempotency.RecordKey
		state idempotency.State
	}{
		{k("victim", "1"), idempotency.Completed}, {k("flooder", "2"), idempotency.Completed},
		{k("flooder", "3"), idempotency.Completed}, {k("flooder", "1"), idempotency.Owned},
	} {
		if got := stateOf(t, s, w.key); got != w.state {
			t.Errorf("%s/%s = %v, want %v", w.key.Scope, w.key.Key, got, w.state)
		}
	}
}
