package redisstore

import (
	"crypto/sha256"
	"encoding/base64"
	"testing"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// TestRedisKeyOneAllocation pins redisKey, on the path of every idempotent
// call, at one allocation (the key's string) and its length at the prefix,
// the braces of the hash tag and the 43 characters of an unpadded base64
// SHA-256 (the size of redisKey's stack buffer).
func TestRedisKeyOneAllocation(t *testing.T) {
	s := &Store{opts: options{prefix: "idem:"}}
	k := idempotency.RecordKey{Scope: "principal-123", FullMethod: "/shop.Orders/Create", Key: "order-0001-abcdef"}
	if n := base64.RawURLEncoding.EncodedLen(sha256.Size); n != 43 {
		t.Fatalf("EncodedLen(sha256.Size) = %d, want 43 (redisKey's buffer)", n)
	}
	if got, want := len(s.redisKey(k)), len("idem:")+2+43; got != want {
		t.Errorf("len(redisKey(%+v)) = %d, want %d", k, got, want)
	}
	if n := testing.AllocsPerRun(100, func() { _ = s.redisKey(k) }); n != 1 {
		t.Errorf("redisKey allocations = %v, want 1", n)
	}
}
