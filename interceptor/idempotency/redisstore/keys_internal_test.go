package redisstore

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// TestRecordKeysOneAllocation pins recordKeys, on the path of every
// idempotent call, at one allocation (the three keys are slices of one
// string) and its layout: the prefix, the hash tag of the scope's hash (22
// characters) and the partition, then the record's hash (the 43 characters
// of an unpadded base64 SHA-256, the size of its stack buffer); the
// partition's accounting keys are the same tag with "#z" and "#s".
func TestRecordKeysOneAllocation(t *testing.T) {
	s := &Store{opts: options{prefix: "idem:", partitions: 16}}
	k := idempotency.RecordKey{Scope: "principal-123", FullMethod: "/shop.Orders/Create", Key: "order-0001-abcdef"}
	if n := base64.RawURLEncoding.EncodedLen(sha256.Size); n != 43 {
		t.Fatalf("EncodedLen(sha256.Size) = %d, want 43 (recordKeys' buffer)", n)
	}
	rk := s.recordKeys(k)
	tag, rest, _ := strings.Cut(strings.TrimPrefix(rk.keys[0], "idem:{"), "}")
	scopeHash, part, _ := strings.Cut(tag, ":")
	if len(scopeHash) != 22 || len(part) == 0 || len(part) > 2 || len(rest) != 43 || rest != rk.member ||
		rk.base != "idem:{"+tag+"}" || rk.keys[1] != rk.base+"#z" || rk.keys[2] != rk.base+"#s" {
		t.Errorf("recordKeys(%+v) = %+v: want idem:{<22>:<partition>}<43> and the same tag with #z, #s", k, rk)
	}
	if n := testing.AllocsPerRun(100, func() { _ = s.recordKeys(k) }); n != 1 {
		t.Errorf("recordKeys allocations = %v, want 1", n)
	}
}
