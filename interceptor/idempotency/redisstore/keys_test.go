package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
)

// crc16 is Redis Cluster's key hash (CRC-16/XMODEM).
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is the Redis Cluster slot of key, hash tags included.
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) % 16384
}

// recordKeys returns the keys of records among keys: not the accounting
// keys of scope partitions (ending in #z and #s).
func recordKeys(keys []string) []string {
	var out []string
	for _, k := range keys {
		if !strings.HasSuffix(k, "#z") && !strings.HasSuffix(k, "#s") {
			out = append(out, k)
		}
	}
	return out
}

// TestRedisKeysAreOurHashNotTheClientsKey pins finding 6 of issue 14 with
// the layout of issue 21's scope quota: the raw client key went into the
// Redis key, so a "{t}" in it was a Cluster hash tag and one client could
// pile every record onto one slot. Each record is one Redis key named by
// a hash of (scope, method, key), inside a hash tag that is a hash of the
// scope and a partition: the client's text is not in it, a client's keys
// fall in its own scope's partitions only (one slot each), and the keys
// of many scopes spread over the slots.
func TestRedisKeysAreOurHashNotTheClientsKey(t *testing.T) {
	client := redistest.Client(t, redistest.Addr(t))
	prefix := redistest.Prefix(t)
	const partitions = 8
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithScopePartitions(partitions))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 64
	claim := func(scope string, i int) {
		k := idempotency.RecordKey{Scope: scope, FullMethod: "/shop.Orders/Create", Key: "{t}order-" + string(rune('A'+i%26)) + strings.Repeat("x", i)}
		if c, err := s.Claim(ctx, k, []byte("fp"), time.Minute); err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim(%q) = %v, %v", k.Key, c.State, err)
		}
	}
	list := func() []string {
		keys, err := client.Keys(ctx, strings.NewReplacer("[", `\[`, "]", `\]`, "*", `\*`, "?", `\?`).Replace(prefix)+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return recordKeys(keys)
	}
	for i := range n {
		claim("tenant", i)
	}
	keys := list()
	if len(keys) != n {
		t.Fatalf("%d Redis keys, want %d (one per record)", len(keys), n)
	}
	slots := map[uint16]bool{}
	for _, k := range keys {
		rest := strings.TrimPrefix(k, prefix)
		if strings.Contains(rest, "{t}") || strings.Contains(rest, "order") || strings.Contains(rest, "tenant") {
			t.Errorf("Redis key %q carries the client's text", k)
		}
		if !strings.HasPrefix(rest, "{") || strings.Count(rest, "{") != 1 || strings.Count(rest, "}") != 1 {
			t.Errorf("Redis key %q: want the prefix, then our hash tag, then our hash", k)
		}
		slots[keySlot(k)] = true
	}
	if len(slots) > partitions {
		t.Errorf("one scope's %d keys fall into %d slots, want at most its %d partitions", n, len(slots), partitions)
	}
	for i := range n {
		claim("tenant-"+string(rune('a'+i%26))+strings.Repeat("y", i), i)
	}
	for _, k := range list() {
		slots[keySlot(k)] = true
	}
	if len(slots) < n/2 {
		t.Errorf("the keys of %d scopes fall into %d slots, want them spread (at least %d)", n+1, len(slots), n/2)
	}
	if _, err := redisstore.New(client, redisstore.WithKeyPrefix("idem:{x}:")); err == nil {
		t.Error(`New(WithKeyPrefix("idem:{x}:")) accepted a prefix with a hash tag, want an error`)
	}
}
