package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
)

// completeKey claims and completes k with a record of reply bytes.
func completeKey(t *testing.T, s *redisstore.Store, k idempotency.RecordKey, reply int) error {
	t.Helper()
	ctx := context.Background()
	c, err := s.Claim(ctx, k, []byte("fp"), time.Minute)
	if err != nil {
		return err
	}
	if c.State != idempotency.Owned {
		t.Fatalf("Claim(%q) = %v, want Owned", k.Key, c.State)
	}
	rec := &idempotency.Record{Fingerprint: []byte("fp"), ReplyType: "x.Y", Reply: make([]byte, reply)}
	if err := s.Complete(ctx, k, c.Token, rec, time.Hour); err != nil {
		t.Fatalf("Complete(%q) = %v", k.Key, err)
	}
	return nil
}

// TestScopeQuotaEvictsItsOwnRecordsPastTheMinimumRetention: a scope at its
// quota evicts its oldest completed record once that record is past the
// minimum retention, and only its own; before that, its claims are refused
// with a RetryAfter of when the oldest may go.
func TestScopeQuotaEvictsItsOwnRecordsPastTheMinimumRetention(t *testing.T) {
	client := redistest.Client(t, redistest.Addr(t))
	ctx := context.Background()
	newStore := func(retention time.Duration) *redisstore.Store {
		s, err := redisstore.New(client, redisstore.WithKeyPrefix(redistest.Prefix(t)), redisstore.WithScopeQuota(3, 0),
			redisstore.WithScopePartitions(1), redisstore.WithMinRetention(retention))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	k := func(scope string, i int) idempotency.RecordKey {
		return idempotency.RecordKey{Scope: scope, FullMethod: "/p.S/M", Key: strconv.Itoa(i)}
	}

	young := newStore(time.Hour)
	for i := range 3 {
		if err := completeKey(t, young, k("a", i), 10); err != nil {
			t.Fatal(err)
		}
	}
	err := completeKey(t, young, k("a", 3), 10)
	var full *idempotency.FullError
	if !errors.As(err, &full) || !full.Scope || full.RetryAfter < 59*time.Minute || full.RetryAfter > time.Hour {
		t.Fatalf("a 4th claim within the minimum retention = %v, want a scope FullError with RetryAfter about 1h", err)
	}

	old := newStore(0)
	for i := range 3 {
		if err := completeKey(t, old, k("a", i), 10); err != nil {
			t.Fatal(err)
		}
	}
	if err := completeKey(t, old, k("b", 0), 10); err != nil {
		t.Fatalf("scope b: %v", err)
	}
	for i := 3; i < 6; i++ { // each evicts scope a's oldest record
		if err := completeKey(t, old, k("a", i), 10); err != nil {
			t.Fatalf("claim %d of scope a past its minimum retention: %v, want room by evicting its oldest", i, err)
		}
	}
	state := func(key idempotency.RecordKey) idempotency.State {
		c, err := old.Claim(ctx, key, []byte("fp"), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return c.State
	}
	if got := state(k("b", 0)); got != idempotency.Completed {
		t.Errorf("scope b's record = %v, want Completed: another scope's records are never evicted", got)
	}
	if got := state(k("a", 5)); got != idempotency.Completed {
		t.Errorf("scope a's newest record = %v, want Completed", got)
	}
}

// TestScopeQuotaBytes: the byte quota counts what a scope's records hold.
func TestScopeQuotaBytes(t *testing.T) {
	client := redistest.Client(t, redistest.Addr(t))
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(redistest.Prefix(t)), redisstore.WithScopeQuota(0, 64<<10),
		redisstore.WithScopePartitions(1), redisstore.WithMinRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; n < 100; n++ {
		if err := completeKey(t, s, idempotency.RecordKey{Scope: "a", FullMethod: "/p.S/M", Key: strconv.Itoa(n)}, 4000); err != nil {
			if !errors.Is(err, idempotency.ErrScopeFull) {
				t.Fatalf("claim %d = %v, want ErrScopeFull once the bytes are used", n, err)
			}
			break
		}
	}
	// 16 records of 4 KB and their overhead fill 64 KiB; the claim that
	// finds the quota passed is refused (the last record was stored past
	// it: an owner's outcome always is).
	if n < 14 || n > 17 {
		t.Errorf("scope a stored %d records of 4 KB under a 64 KiB quota, want 14 to 17", n)
	}
}

// TestQuotaBytesCountWhatRedisHolds holds the byte accounting (the
// partition's '#' sum, entryOverhead and the key names) within 25% of what
// Redis's used_memory grows by, for leases and for completed records of
// two sizes, so that a byte quota derived from maxmemory means what it says.
func TestQuotaBytesCountWhatRedisHolds(t *testing.T) {
	srv := redistest.Start(t)
	client := redistest.Client(t, srv.Addr)
	ctx := context.Background()
	used := func() int64 {
		info, err := client.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no used_memory in INFO memory")
		return 0
	}
	accounted := func(prefix string) int64 {
		var sum int64
		keys, err := client.Keys(ctx, prefix+"*#s").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			v, err := client.HGet(ctx, k, "#").Int64()
			if err != nil {
				t.Fatal(err)
			}
			sum += v
		}
		return sum
	}
	const n = 2000
	for _, tc := range []struct {
		name  string
		reply int // -1: leases only
	}{{"leases", -1}, {"records of 100 bytes", 100}, {"records of 2 KB", 2000}} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := redistest.Prefix(t)
			s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithScopeQuota(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			before := used()
			for i := range n {
				k := idempotency.RecordKey{Scope: fmt.Sprint("tenant-", i%10), FullMethod: "/p.S/M", Key: strconv.Itoa(i)}
				if tc.reply < 0 {
					if _, err := s.Claim(ctx, k, bytes.Repeat([]byte{1}, 32), time.Hour); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := completeKey(t, s, k, tc.reply); err != nil {
					t.Fatal(err)
				}
			}
			grew, counted := used()-before, accounted(prefix)
			t.Logf("%s: used_memory grew %d bytes (%d per entry), the quota counted %d (%d per entry)", tc.name, grew, grew/n, counted, counted/n)
			if r := float64(counted) / float64(grew); r < 0.75 || r > 1.25 {
				t.Errorf("counted/used = %.2f, want within 25%%", r)
			}
		})
	}
}

// TestOpenDerivesTheScopeQuotaFromMaxmemory: with default options, Open
// gives each scope a quarter of the server's maxmemory in bytes, so one
// scope is refused before it fills Redis.
func TestOpenDerivesTheScopeQuotaFromMaxmemory(t *testing.T) {
	srv := redistest.StartWith(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
	client := redistest.Client(t, srv.Addr)
	s, err := redisstore.Open(context.Background(), client, redisstore.WithKeyPrefix(redistest.Prefix(t)),
		redisstore.WithMinRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; n < 1000; n++ {
		if err := completeKey(t, s, idempotency.RecordKey{Scope: "a", FullMethod: "/p.S/M", Key: strconv.Itoa(n)}, 16<<10); err != nil {
			if !errors.Is(err, idempotency.ErrScopeFull) {
				t.Fatalf("claim %d = %v, want ErrScopeFull at a quarter of maxmemory", n, err)
			}
			break
		}
	}
	// A quarter of 8 MiB is 2 MiB: about 127 records of 16 KiB and their
	// overhead.
	if n < 120 || n > 130 {
		t.Errorf("scope a stored %d records of 16 KiB under maxmemory 8mb, want about 127 (2 MiB)", n)
	}
	if err := completeKey(t, s, idempotency.RecordKey{Scope: "b", FullMethod: "/p.S/M", Key: "0"}, 16<<10); err != nil {
		t.Errorf("scope b: %v, want room", err)
	}
}

// TestClaimOutOfMemoryIsStoreFull pins the OOM half of item 3 of issue
// 21: a Claim that Redis refuses for memory (maxmemory reached with
// noeviction) returned a plain error, which the interceptor answers with
// UNAVAILABLE as an outage. It now wraps an *idempotency.FullError of the
// store (ErrStoreFull, not ErrScopeFull) with a retry hint, and it is
// logged for the operator.
func TestClaimOutOfMemoryIsStoreFull(t *testing.T) {
	srv := redistest.StartWith(t, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	client := redistest.Client(t, srv.Addr)
	ctx := context.Background()
	var log bytes.Buffer
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(redistest.Prefix(t)), redisstore.WithScopeQuota(0, 0),
		redisstore.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	redistest.FillPastMaxmemory(t, client)
	_, err = s.Claim(ctx, idempotency.RecordKey{Scope: "a", FullMethod: "/p.S/M", Key: "k"}, []byte("fp"), time.Minute)
	var full *idempotency.FullError
	if !errors.As(err, &full) || full.Scope || full.RetryAfter <= 0 || !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Claim on a Redis out of memory = %v, want a FullError of the store with a RetryAfter", err)
	}
	if !strings.Contains(err.Error(), "out of memory") || !strings.Contains(log.String(), "Redis is out of memory") {
		t.Errorf("error %q, log %q: want both to say Redis is out of memory", err, log.String())
	}
}

// TestCompletePastTheScopeQuotaIsKeptForTheMinimumRetention: the quota is
// checked when a key is claimed, so calls in flight together all pass it
// and their outcomes, always stored, took the scope past its quota for the
// records' whole TTL; on a noeviction Redis nothing else could free that
// room (another scope may not evict them). Now a record that does not fit
// is stored, and replayed, but kept for the minimum retention only; the
// records that fit keep their TTL, and once the minimum retention has
// passed the excess has gone.
func TestCompletePastTheScopeQuotaIsKeptForTheMinimumRetention(t *testing.T) {
	client := redistest.Client(t, redistest.Addr(t))
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	const quota = 64 << 10
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithScopeQuota(0, quota),
		redisstore.WithScopePartitions(1), redisstore.WithMinRetention(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	k := func(i int) idempotency.RecordKey {
		return idempotency.RecordKey{Scope: "a", FullMethod: "/p.S/M", Key: strconv.Itoa(i)}
	}
	const inFlight = 8 // records of a quarter of the quota each: twice the quota in all
	tokens := make([]string, inFlight)
	for i := range inFlight {
		c, err := s.Claim(ctx, k(i), []byte("fp"), time.Minute)
		if err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim(%d) = %v, %v, want Owned", i, c.State, err)
		}
		tokens[i] = c.Token
	}
	for i := range inFlight {
		rec := &idempotency.Record{Fingerprint: []byte("fp"), ReplyType: "x.Y", Reply: make([]byte, quota/4)}
		if err := s.Complete(ctx, k(i), tokens[i], rec, time.Hour); err != nil {
			t.Fatalf("Complete(%d) = %v, want the outcome stored past the quota", i, err)
		}
		c, err := s.Claim(ctx, k(i), []byte("fp"), time.Minute)
		if err != nil || c.State != idempotency.Completed {
			t.Fatalf("duplicate of %d: %v, %v, want Completed", i, c.State, err)
		}
	}
	long, short := recordTTLs(t, client, prefix)
	if long < 2 || long > 4 || long+short != inFlight {
		t.Errorf("records kept for their TTL: %d, for the minimum retention: %d; want 2 to 4 within the quota, the rest short",
			long, short)
	}
	if err := redistest.Advance(ctx, client, prefix, time.Minute+time.Second); err != nil {
		t.Fatal(err)
	}
	if long2, short2 := recordTTLs(t, client, prefix); long2 != long || short2 != 0 {
		t.Errorf("after the minimum retention: %d long and %d short records, want %d and 0", long2, short2, long)
	}
}

// recordTTLs counts the record hashes under prefix whose time to live is
// more than a minute (long) and at most a minute (short).
func recordTTLs(t *testing.T, client *redis.Client, prefix string) (long, short int) {
	t.Helper()
	ctx := context.Background()
	iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		if strings.HasSuffix(key, "#z") || strings.HasSuffix(key, "#s") {
			continue
		}
		ttl, err := client.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl > time.Minute {
			long++
		} else {
			short++
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return long, short
}

// TestCompleteOnRedisOutOfMemoryStoresTheOutcome: Redis refuses a script's
// writes for memory only until the script has written once. Complete's
// first write on the path of a key whose lease had ended (absent, no one
// claimed it since) was an HSET, which Redis refused at maxmemory: the
// handler's outcome was lost, the claim released, and a duplicate ran the
// handler again. Complete now writes first what Redis allows out of memory
// (HDEL), on every path, so the outcome is stored, owned or absent.
func TestCompleteOnRedisOutOfMemoryStoresTheOutcome(t *testing.T) {
	srv := redistest.StartWith(t, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	client := redistest.Client(t, srv.Addr)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	k := func(key string) idempotency.RecordKey {
		return idempotency.RecordKey{Scope: "a", FullMethod: "/p.S/M", Key: key}
	}
	absent, err := s.Claim(ctx, k("absent"), []byte("fp"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := redistest.Advance(ctx, client, prefix, 2*time.Second); err != nil { // its lease ends
		t.Fatal(err)
	}
	owned, err := s.Claim(ctx, k("owned"), []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	redistest.FillPastMaxmemory(t, client)
	for key, token := range map[string]string{"absent": absent.Token, "owned": owned.Token} {
		rec := &idempotency.Record{Fingerprint: []byte("fp"), ReplyType: "x.Y", Reply: []byte("reply")}
		if err := s.Complete(ctx, k(key), token, rec, time.Hour); err != nil {
			t.Errorf("Complete of the %s key on a Redis out of memory = %v, want the outcome stored", key, err)
			continue
		}
		if c, err := s.Claim(ctx, k(key), []byte("fp"), time.Minute); err != nil || c.State != idempotency.Completed {
			t.Errorf("duplicate of the %s key: %v, %v, want Completed", key, c.State, err)
		}
	}
}
