package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// Harness is a store under test.
type Harness struct {
	// Store is fresh and empty, and isolated from other harnesses.
	Store idempotency.Store
	// Advance moves the store's time forward by d: afterwards, leases and
	// records that end within d must have ended. For a store on real time,
	// Advance may shorten the remaining lifetimes of its entries instead.
	Advance func(t testing.TB, d time.Duration)
	// MaxRecordBytes is the store's bound on a record's size, as
	// idempotency.Record.Size estimates it.
	MaxRecordBytes int
}

// Run runs the conformance suite, each test on a harness of its own.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		run  func(t *testing.T, h Harness)
	}{
		{"ClaimFreeKeyIsOwned", testClaimFree},
		{"ClaimHeldKeyIsInProgress", testClaimInProgress},
		{"CompleteThenClaimReturnsRecord", testCompleteReplay},
		{"FingerprintMismatchRevealsNothing", testMismatch},
		{"KeysDifferInEveryPart", testKeyParts},
		{"ReleaseFreesKey", testRelease},
		{"OnlyOwnerCompletesOrReleases", testOnlyOwner},
		{"LeaseEnds", testLeaseEnds},
		{"CompleteAfterLeaseEndsStoresWhenAbsent", testCompleteAfterLease},
		{"CompleteAfterAnotherClaimIsNotOwner", testCompleteAfterOtherClaim},
		{"RenewExtendsTheLease", testRenew},
		{"OnlyOwnerRenews", testRenewNotOwner},
		{"RecordTTLEnds", testTTL},
		{"RecordTooLargeKeepsClaim", testTooLarge},
		{"ConcurrentClaimsHaveOneOwner", testConcurrentClaims},
		{"FingerprintsOfAnyLength", testFingerprintLengths},
		{"TokensAreNeverReused", testTokensNeverReused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newHarness(t)) })
	}
}

var (
	fpA = bytes.Repeat([]byte{0xA1}, 32)
	fpB = bytes.Repeat([]byte{0xB2}, 32)
)

func key(k string) idempotency.RecordKey {
	return idempotency.RecordKey{Scope: "tenant-1", FullMethod: "/resilience.echo.v1.EchoService/Echo", Key: k}
}

func sampleRecord(fp []byte) *idempotency.Record {
	detail, err := anypb.New(&anypb.Any{TypeUrl: "example.com/x", Value: []byte{1, 2, 3}})
	if err != nil {
		panic(err)
	}
	return &idempotency.Record{
		Fingerprint: fp,
		Code:        codes.NotFound,
		Message:     "no such order",
		Details:     []*anypb.Any{detail},
		Header:      metadata.Pairs("x-h", "1", "x-bin", "\x00\xff"),
		Trailer:     metadata.Pairs("x-t", "a", "x-t", "b"),
	}
}

func claim(t testing.TB, h Harness, k idempotency.RecordKey, fp []byte, lease time.Duration) idempotency.Claim {
	t.Helper()
	c, err := h.Store.Claim(context.Background(), k, fp, lease)
	if err != nil {
		t.Fatalf("Claim(%q) error = %v", k.Key, err)
	}
	return c
}

func wantState(t testing.TB, c idempotency.Claim, want idempotency.State) {
	t.Helper()
	if c.State != want {
		t.Fatalf("Claim state = %v, want %v", c.State, want)
	}
}

func testClaimFree(t *testing.T, h Harness) {
	c := claim(t, h, key("k"), fpA, time.Minute)
	wantState(t, c, idempotency.Owned)
	if c.Token == "" || c.Record != nil {
		t.Errorf("Owned claim = %+v, want a token and no record", c)
	}
}

func testClaimInProgress(t *testing.T, h Harness) {
	wantState(t, claim(t, h, key("k"), fpA, time.Minute), idempotency.Owned)
	c := claim(t, h, key("k"), fpA, time.Minute)
	wantState(t, c, idempotency.InProgress)
	if c.Token != "" || c.RetryAfter <= 0 || c.RetryAfter > time.Minute {
		t.Errorf("InProgress claim = %+v, want no token and 0 < RetryAfter <= 1m", c)
	}
}

func testCompleteReplay(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Minute)
	rec := sampleRecord(fpA)
	if err := h.Store.Complete(ctx, key("k"), c.Token, rec, time.Hour); err != nil {
		t.Fatalf("Complete() error = %v", err)
	}
	for range 2 { // replays do not consume the record
		got := claim(t, h, key("k"), fpA, time.Minute)
		wantState(t, got, idempotency.Completed)
		if err := equalRecords(got.Record, sampleRecord(fpA)); err != nil {
			t.Fatalf("replayed record: %v", err)
		}
	}
	if err := h.Store.Release(ctx, key("k"), c.Token); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Release() after Complete error = %v, want ErrNotOwner", err)
	}
}

func testMismatch(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Minute)
	got := claim(t, h, key("k"), fpB, time.Minute)
	wantState(t, got, idempotency.Mismatch)
	if got.Record != nil || got.Token != "" {
		t.Errorf("Mismatch while in progress = %+v, want nothing revealed", got)
	}
	if err := h.Store.Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour); err != nil {
		t.Fatalf("Complete() error = %v", err)
	}
	got = claim(t, h, key("k"), fpB, time.Minute)
	wantState(t, got, idempotency.Mismatch)
	if got.Record != nil {
		t.Errorf("Mismatch after completion revealed a record: %+v", got.Record)
	}
}

func testKeyParts(t *testing.T, h Harness) {
	base := key("k")
	others := []idempotency.RecordKey{
		{Scope: "tenant-2", FullMethod: base.FullMethod, Key: base.Key},
		{Scope: "", FullMethod: base.FullMethod, Key: base.Key},
		{Scope: base.Scope, FullMethod: "/resilience.echo.v1.EchoService/Lookup", Key: base.Key},
		{Scope: base.Scope, FullMethod: base.FullMethod, Key: "k2"},
		// Concatenations that collide unless parts are delimited.
		{Scope: base.Scope + "/resilience.echo.v1.EchoService", FullMethod: "/Echo", Key: base.Key},
	}
	wantState(t, claim(t, h, base, fpA, time.Minute), idempotency.Owned)
	for _, k := range others {
		if c := claim(t, h, k, fpB, time.Minute); c.State != idempotency.Owned {
			t.Errorf("Claim(%+v) = %v, want Owned: keys must differ in each part", k, c.State)
		}
	}
}

func testRelease(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Minute)
	if err := h.Store.Release(ctx, key("k"), c.Token); err != nil {
		t.Fatalf("Release() error = %v", err)
	}
	// Free again: even another fingerprint may claim it.
	c2 := claim(t, h, key("k"), fpB, time.Minute)
	wantState(t, c2, idempotency.Owned)
	if c2.Token == c.Token {
		t.Errorf("second owner got token %q again", c2.Token)
	}
	if err := h.Store.Release(ctx, key("k"), c.Token); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Release() with the first owner's token error = %v, want ErrNotOwner", err)
	}
}

func testOnlyOwner(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Minute)
	if err := h.Store.Complete(ctx, key("k"), c.Token+"x", sampleRecord(fpA), time.Hour); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Complete() with a wrong token error = %v, want ErrNotOwner", err)
	}
	if err := h.Store.Release(ctx, key("k"), c.Token+"x"); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Release() with a wrong token error = %v, want ErrNotOwner", err)
	}
	wantState(t, claim(t, h, key("k"), fpA, time.Minute), idempotency.InProgress)
	// A completed key is no one's to complete again.
	if err := h.Store.Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Complete(ctx, key("k"), c.Token, sampleRecord(fpB), time.Hour); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Complete() of a completed key error = %v, want ErrNotOwner", err)
	}
}

func testLeaseEnds(t *testing.T, h Harness) {
	wantState(t, claim(t, h, key("k"), fpA, time.Second), idempotency.Owned)
	h.Advance(t, 500*time.Millisecond)
	wantState(t, claim(t, h, key("k"), fpA, time.Second), idempotency.InProgress)
	h.Advance(t, 600*time.Millisecond)
	// The crashed owner's lease has ended: the key is free, for any request.
	wantState(t, claim(t, h, key("k"), fpB, time.Second), idempotency.Owned)
}

func testCompleteAfterLease(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Second)
	h.Advance(t, 2*time.Second)
	// No one claimed the key since the lease ended: the outcome is its own.
	if err := h.Store.Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour); err != nil {
		t.Fatalf("Complete() after the lease ended, key absent: error = %v, want the record stored", err)
	}
	got := claim(t, h, key("k"), fpA, time.Second)
	wantState(t, got, idempotency.Completed)
	if err := equalRecords(got.Record, sampleRecord(fpA)); err != nil {
		t.Error(err)
	}
	wantState(t, claim(t, h, key("k"), fpB, time.Second), idempotency.Mismatch)
}

func testCompleteAfterOtherClaim(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Second)
	h.Advance(t, 2*time.Second)
	other := claim(t, h, key("k"), fpA, time.Minute)
	wantState(t, other, idempotency.Owned)
	if err := h.Store.Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Complete() after another owner claimed the key: error = %v, want ErrNotOwner", err)
	}
	if err := h.Store.Complete(ctx, key("k"), other.Token, sampleRecord(fpA), time.Hour); err != nil {
		t.Errorf("Complete() by the new owner: error = %v", err)
	}
}

func testRenew(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Second)
	for range 3 {
		h.Advance(t, 700*time.Millisecond)
		if err := h.Store.Renew(ctx, key("k"), c.Token, time.Second); err != nil {
			t.Fatalf("Renew() error = %v", err)
		}
	}
	// 2.1 s after a claim of 1 s: held, thanks to the renewals.
	got := claim(t, h, key("k"), fpA, time.Second)
	wantState(t, got, idempotency.InProgress)
	if got.RetryAfter <= 0 || got.RetryAfter > time.Second {
		t.Errorf("RetryAfter = %v, want the renewed lease's rest, in (0, 1s]", got.RetryAfter)
	}
	h.Advance(t, 1100*time.Millisecond)
	wantState(t, claim(t, h, key("k"), fpA, time.Second), idempotency.Owned)
}

func testRenewNotOwner(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Second)
	if err := h.Store.Renew(ctx, key("k"), c.Token+"x", time.Second); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Renew() with another token: error = %v, want ErrNotOwner", err)
	}
	if err := h.Store.Renew(ctx, key("other"), c.Token, time.Second); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Renew() of an absent key: error = %v, want ErrNotOwner", err)
	}
	if err := h.Store.Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Renew(ctx, key("k"), c.Token, time.Second); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Renew() after Complete: error = %v, want ErrNotOwner", err)
	}
	wantState(t, claim(t, h, key("k"), fpA, time.Second), idempotency.Completed)
}

func testTTL(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Second)
	// The TTL runs from completion and replaces the lease.
	if err := h.Store.Complete(ctx, key("k"), c.Token, sampleRecord(fpA), 10*time.Second); err != nil {
		t.Fatalf("Complete() error = %v", err)
	}
	h.Advance(t, 5*time.Second)
	wantState(t, claim(t, h, key("k"), fpA, time.Second), idempotency.Completed)
	h.Advance(t, 6*time.Second)
	wantState(t, claim(t, h, key("k"), fpA, time.Second), idempotency.Owned)
}

func testTooLarge(t *testing.T, h Harness) {
	ctx := context.Background()
	c := claim(t, h, key("k"), fpA, time.Minute)
	rec := &idempotency.Record{Fingerprint: fpA, ReplyType: "x.Y", Reply: make([]byte, h.MaxRecordBytes)}
	if err := h.Store.Complete(ctx, key("k"), c.Token, rec, time.Hour); !errors.Is(err, idempotency.ErrRecordTooLarge) {
		t.Fatalf("Complete() of a %d-byte record error = %v, want ErrRecordTooLarge", rec.Size(), err)
	}
	wantState(t, claim(t, h, key("k"), fpA, time.Minute), idempotency.InProgress)
	if err := h.Store.Release(ctx, key("k"), c.Token); err != nil {
		t.Fatalf("Release() after ErrRecordTooLarge error = %v", err)
	}
	wantState(t, claim(t, h, key("k"), fpA, time.Minute), idempotency.Owned)
}

func testConcurrentClaims(t *testing.T, h Harness) {
	const n = 32
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		states = map[idempotency.State]int{}
	)
	for range n {
		wg.Go(func() {
			c, err := h.Store.Claim(context.Background(), key("k"), fpA, time.Minute)
			if err != nil {
				t.Errorf("Claim() error = %v", err)
				return
			}
			mu.Lock()
			states[c.State]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if states[idempotency.Owned] != 1 || states[idempotency.InProgress] != n-1 {
		t.Errorf("%d concurrent claims gave %v, want 1 Owned and %d InProgress", n, states, n-1)
	}
}

func testFingerprintLengths(t *testing.T, h Harness) {
	// Around the 32 bytes of a SHA-256: a store may keep short fingerprints
	// differently from long ones. Fingerprints that differ only in their
	// last byte, or only in their length, are different.
	for _, n := range []int{1, 31, 32, 33, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			k := key(fmt.Sprint("fp-len-", n))
			fp := bytes.Repeat([]byte{0xC3}, n)
			mine := bytes.Clone(fp)
			c := claim(t, h, k, mine, time.Minute)
			wantState(t, c, idempotency.Owned)
			mine[0] ^= 0xFF // the store keeps its own copy
			wantState(t, claim(t, h, k, fp, time.Minute), idempotency.InProgress)
			last := bytes.Clone(fp)
			last[n-1]++
			wantState(t, claim(t, h, k, last, time.Minute), idempotency.Mismatch)
			wantState(t, claim(t, h, k, fp[:n-1], time.Minute), idempotency.Mismatch)
			wantState(t, claim(t, h, k, append(bytes.Clone(fp), 0xC3), time.Minute), idempotency.Mismatch)
			if err := h.Store.Complete(context.Background(), k, c.Token, sampleRecord(fp), time.Hour); err != nil {
				t.Fatalf("Complete() error = %v", err)
			}
			wantState(t, claim(t, h, k, fp, time.Minute), idempotency.Completed)
			wantState(t, claim(t, h, k, last, time.Minute), idempotency.Mismatch)
		})
	}
}

func testTokensNeverReused(t *testing.T, h Harness) {
	// Enough claims of one key to cross any batching of tokens a store may
	// do; a stale token never owns the key again.
	const n = 600
	ctx := context.Background()
	seen := make(map[string]bool, n)
	var prev string
	for i := range n {
		c := claim(t, h, key("k"), fpA, time.Minute)
		wantState(t, c, idempotency.Owned)
		if seen[c.Token] {
			t.Fatalf("claim %d got token %q again", i, c.Token)
		}
		seen[c.Token] = true
		if prev != "" {
			if err := h.Store.Release(ctx, key("k"), prev); !errors.Is(err, idempotency.ErrNotOwner) {
				t.Fatalf("Release() with the previous owner's token error = %v, want ErrNotOwner", err)
			}
		}
		if err := h.Store.Release(ctx, key("k"), c.Token); err != nil {
			t.Fatalf("Release() error = %v", err)
		}
		prev = c.Token
	}
}

func equalRecords(got, want *idempotency.Record) error {
	a, err := got.MarshalBinary()
	if err != nil {
		return err
	}
	b, err := want.MarshalBinary()
	if err != nil {
		return err
	}
	if !bytes.Equal(a, b) {
		return fmt.Errorf("got %+v, want %+v", got, want)
	}
	return nil
}
