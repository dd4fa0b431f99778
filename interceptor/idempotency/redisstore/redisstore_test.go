package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testMaxRecord = 4096

func TestConformance(t *testing.T) {
	addr := redistest.Addr(t)
	client := redistest.Client(t, addr)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		prefix := redistest.Prefix(t)
		s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithMaxRecordBytes(testMaxRecord))
		if err != nil {
			t.Fatalf("New() error = %v", err)
		}
		return storetest.Harness{
			Store: s,
			Advance: func(t testing.TB, d time.Duration) {
				if err := redistest.Advance(context.Background(), client, prefix, d); err != nil {
					t.Fatalf("Advance(%v) error = %v", d, err)
				}
			},
			MaxRecordBytes: testMaxRecord,
		}
	})
}

func TestRoundTripsFirstExecutionTwoReplayOne(t *testing.T) {
	client := redistest.Client(t, redistest.Addr(t))
	hook := redistest.CountRoundTrips(client)
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fp := []byte("fingerprint")
	run := func(k string) (int64, int64) {
		key := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: k}
		before := hook.N()
		c, err := s.Claim(ctx, key, fp, time.Minute)
		if err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim() = %v, %v, want Owned", c.State, err)
		}
		if err := s.Complete(ctx, key, c.Token, &idempotency.Record{Fingerprint: fp, ReplyType: "x.Y", Reply: []byte("r")}, time.Hour); err != nil {
			t.Fatalf("Complete() error = %v", err)
		}
		first := hook.N() - before
		before = hook.N()
		if c, err := s.Claim(ctx, key, fp, time.Minute); err != nil || c.State != idempotency.Completed {
			t.Fatalf("replay Claim() = %v, %v, want Completed", c.State, err)
		}
		return first, hook.N() - before
	}
	run("warm-up") // loads the scripts into the server's cache
	first, replay := run("k")
	if first != 2 || replay != 1 {
		t.Errorf("round trips: first execution %d, replay %d; want 2 and 1", first, replay)
	}
	t.Logf("round trips: first execution %d, replay %d", first, replay)
}

func TestOutageReturnsError(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1, DialTimeout: time.Second})
	defer client.Close()
	s, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = s.Claim(ctx, idempotency.RecordKey{Key: "k"}, []byte("fp"), time.Second)
	if err == nil {
		t.Fatal("Claim() against a closed port error = nil, want an error")
	}
	if errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Claim() error = %v, want a connection error", err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := redisstore.New(nil); err == nil {
		t.Error("New(nil) error = nil, want an error")
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := redisstore.New(c, redisstore.WithMaxRecordBytes(0)); err == nil {
		t.Error("New(WithMaxRecordBytes(0)) error = nil, want an error")
	}
}
