package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/suite"

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
	// QuotaStore, for a store that bounds what each scope holds, is
	// another fresh store on the same time (Advance moves it too) whose
	// every scope holds at most QuotaEntries keys, exactly; nil skips the
	// quota tests.
	QuotaStore   idempotency.Store
	QuotaEntries int
	// Stall, for a store with a backend over the network, makes the
	// backend stop answering Store, as a network partition or a server
	// that hangs does (its requests go out, no reply comes back), until
	// resume is called; Stall may be called once per test, and the suite
	// calls resume before the test ends. nil skips the tests of a store
	// that hangs (a store in memory never waits on anything).
	Stall func(t testing.TB) (resume func())
}

// Run runs the conformance suite, a testify suite ([Suite]), each test on
// a fresh harness from newHarness.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	suite.Run(t, &Suite{newHarness: newHarness})
}

// Suite is the conformance suite as a testify suite: every Test method
// runs on a harness of its own, made by SetupTest. Use it through [Run].
type Suite struct {
	suite.Suite
	newHarness func(t *testing.T) Harness // immutable
	h          Harness                    // the current test's; written by SetupTest
}

// SetupTest makes the harness of the next test.
func (s *Suite) SetupTest() { s.h = s.newHarness(s.T()) }

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

// claim claims k and requires no error.
func (s *Suite) claim(k idempotency.RecordKey, fp []byte, lease time.Duration) idempotency.Claim {
	c, err := s.h.Store.Claim(context.Background(), k, fp, lease)
	s.Require().NoError(err, "Claim(%q)", k.Key)
	return c
}

// claimState claims k and requires the claim's state to be want.
func (s *Suite) claimState(k idempotency.RecordKey, fp []byte, lease time.Duration, want idempotency.State) idempotency.Claim {
	c := s.claim(k, fp, lease)
	s.Require().Equal(want, c.State, "Claim(%q) state", k.Key)
	return c
}

// advance moves the store's time forward.
func (s *Suite) advance(d time.Duration) { s.h.Advance(s.T(), d) }

// store is the current test's store.
func (s *Suite) store() idempotency.Store { return s.h.Store }

// TestClaimFreeKeyIsOwned checks that a Claim of a free key is Owned, with a
// token and no record.
func (s *Suite) TestClaimFreeKeyIsOwned() {
	c := s.claim(key("k"), fpA, time.Minute)
	s.Require().Equal(idempotency.Owned, c.State)
	s.NotEmpty(c.Token, "Owned claim's token")
	s.Nil(c.Record, "Owned claim's record")
}

// TestClaimHeldKeyIsInProgress checks that a Claim of a held key is
// InProgress, with no token and a RetryAfter within the lease.
func (s *Suite) TestClaimHeldKeyIsInProgress() {
	s.claimState(key("k"), fpA, time.Minute, idempotency.Owned)
	c := s.claim(key("k"), fpA, time.Minute)
	s.Require().Equal(idempotency.InProgress, c.State)
	s.Empty(c.Token, "InProgress claim's token")
	s.Greater(c.RetryAfter, time.Duration(0), "InProgress claim's RetryAfter")
	s.LessOrEqual(c.RetryAfter, time.Minute, "InProgress claim's RetryAfter")
}

// TestCompleteThenClaimReturnsRecord checks that a completed key replays its
// record to every later Claim, and that the owner can no longer Release it.
func (s *Suite) TestCompleteThenClaimReturnsRecord() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Minute)
	rec := sampleRecord(fpA)
	s.Require().NoError(s.store().Complete(ctx, key("k"), c.Token, rec, time.Hour), "Complete()")
	for range 2 { // replays do not consume the record
		got := s.claim(key("k"), fpA, time.Minute)
		s.Require().Equal(idempotency.Completed, got.State)
		s.Require().NoError(equalRecords(got.Record, sampleRecord(fpA)))
	}
	s.ErrorIs(s.store().Release(ctx, key("k"), c.Token), idempotency.ErrNotOwner, "Release() after Complete")
}

// TestFingerprintMismatchRevealsNothing checks that a Claim with another
// fingerprint is Mismatch, with no token or record, while the key is held
// and once it is completed.
func (s *Suite) TestFingerprintMismatchRevealsNothing() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Minute)
	got := s.claim(key("k"), fpB, time.Minute)
	s.Require().Equal(idempotency.Mismatch, got.State)
	s.Nil(got.Record, "Mismatch while in progress revealed a record")
	s.Empty(got.Token, "Mismatch while in progress gave a token")
	s.Require().NoError(s.store().Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour), "Complete()")
	got = s.claim(key("k"), fpB, time.Minute)
	s.Require().Equal(idempotency.Mismatch, got.State)
	s.Nil(got.Record, "Mismatch after completion revealed a record")
}

// TestKeysDifferInEveryPart checks that record keys differing in scope,
// method or key, or only in where their parts split, are different keys.
func (s *Suite) TestKeysDifferInEveryPart() {
	base := key("k")
	others := []idempotency.RecordKey{
		{Scope: "tenant-2", FullMethod: base.FullMethod, Key: base.Key},
		{Scope: "", FullMethod: base.FullMethod, Key: base.Key},
		{Scope: base.Scope, FullMethod: "/resilience.echo.v1.EchoService/Lookup", Key: base.Key},
		{Scope: base.Scope, FullMethod: base.FullMethod, Key: "k2"},
		// Concatenations that collide unless parts are delimited.
		{Scope: base.Scope + "/resilience.echo.v1.EchoService", FullMethod: "/Echo", Key: base.Key},
	}
	s.claimState(base, fpA, time.Minute, idempotency.Owned)
	for _, k := range others {
		if c := s.claim(k, fpB, time.Minute); c.State != idempotency.Owned {
			s.Failf("keys must differ in each part", "Claim(%+v) = %v, want Owned", k, c.State)
		}
	}
}

// TestReleaseFreesKey checks that a released key may be claimed again, with
// a new token, and that the old token no longer owns it.
func (s *Suite) TestReleaseFreesKey() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Minute)
	s.Require().NoError(s.store().Release(ctx, key("k"), c.Token), "Release()")
	// Free again: even another fingerprint may claim it.
	c2 := s.claim(key("k"), fpB, time.Minute)
	s.Require().Equal(idempotency.Owned, c2.State)
	if c2.Token == c.Token {
		s.Failf("token reused", "second owner got token %q again", c2.Token)
	}
	s.ErrorIs(s.store().Release(ctx, key("k"), c.Token), idempotency.ErrNotOwner, "Release() with the first owner's token")
}

// TestOnlyOwnerCompletesOrReleases checks that Complete and Release with a
// wrong token, or of a completed key, fail with ErrNotOwner and leave the
// key as it was.
func (s *Suite) TestOnlyOwnerCompletesOrReleases() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Minute)
	s.ErrorIs(s.store().Complete(ctx, key("k"), c.Token+"x", sampleRecord(fpA), time.Hour), idempotency.ErrNotOwner, "Complete() with a wrong token")
	s.ErrorIs(s.store().Release(ctx, key("k"), c.Token+"x"), idempotency.ErrNotOwner, "Release() with a wrong token")
	s.claimState(key("k"), fpA, time.Minute, idempotency.InProgress)
	// A completed key is no one's to complete again.
	s.Require().NoError(s.store().Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour))
	s.ErrorIs(s.store().Complete(ctx, key("k"), c.Token, sampleRecord(fpB), time.Hour), idempotency.ErrNotOwner, "Complete() of a completed key")
}

// TestLeaseEnds checks that a claim holds its key for its lease and no
// longer. The lease is a minute, so that a store on real time (Redis's
// TTLs, moved by Advance) keeps the key while a busy machine runs the test:
// with a lease of 1 s, half of it advanced, a scheduling delay of half a
// second freed the key early.
func (s *Suite) TestLeaseEnds() {
	s.claimState(key("k"), fpA, time.Minute, idempotency.Owned)
	s.advance(30 * time.Second)
	s.claimState(key("k"), fpA, time.Minute, idempotency.InProgress)
	s.advance(31 * time.Second)
	// The crashed owner's lease has ended: the key is free, for any request.
	s.claimState(key("k"), fpB, time.Minute, idempotency.Owned)
}

// TestCompleteAfterLeaseEndsStoresWhenAbsent checks that an owner whose
// lease ended, with no claim since, still stores its record.
func (s *Suite) TestCompleteAfterLeaseEndsStoresWhenAbsent() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Second)
	s.advance(2 * time.Second)
	// No one claimed the key since the lease ended: the outcome is its own.
	s.Require().NoError(s.store().Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour), "Complete() after the lease ended, key absent")
	got := s.claim(key("k"), fpA, time.Second)
	s.Require().Equal(idempotency.Completed, got.State)
	s.Require().NoError(equalRecords(got.Record, sampleRecord(fpA)))
	s.claimState(key("k"), fpB, time.Second, idempotency.Mismatch)
}

// TestCompleteAfterAnotherClaimIsNotOwner checks that an owner whose lease
// ended and whose key was claimed again cannot Complete it, and that the new
// owner can.
func (s *Suite) TestCompleteAfterAnotherClaimIsNotOwner() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Second)
	s.advance(2 * time.Second)
	other := s.claim(key("k"), fpA, time.Minute)
	s.Require().Equal(idempotency.Owned, other.State)
	s.ErrorIs(s.store().Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour), idempotency.ErrNotOwner, "Complete() after another owner claimed the key")
	s.NoError(s.store().Complete(ctx, key("k"), other.Token, sampleRecord(fpA), time.Hour), "Complete() by the new owner")
}

// TestRenewExtendsTheLease checks that Renew extends the owner's lease from
// the time of the renewal (a lease of a minute, for stores on real time:
// see TestLeaseEnds).
func (s *Suite) TestRenewExtendsTheLease() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Minute)
	for range 3 {
		s.advance(42 * time.Second)
		s.Require().NoError(s.store().Renew(ctx, key("k"), c.Token, time.Minute), "Renew()")
	}
	// 126 s after a claim of a minute: held, thanks to the renewals.
	got := s.claim(key("k"), fpA, time.Minute)
	s.Require().Equal(idempotency.InProgress, got.State)
	s.Greater(got.RetryAfter, time.Duration(0), "RetryAfter: want the renewed lease's rest")
	s.LessOrEqual(got.RetryAfter, time.Minute, "RetryAfter: want the renewed lease's rest")
	s.advance(66 * time.Second)
	s.claimState(key("k"), fpA, time.Minute, idempotency.Owned)
}

// TestOnlyOwnerRenews checks that Renew with a wrong token, of an absent
// key, or after Complete fails with ErrNotOwner.
func (s *Suite) TestOnlyOwnerRenews() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Second)
	s.ErrorIs(s.store().Renew(ctx, key("k"), c.Token+"x", time.Second), idempotency.ErrNotOwner, "Renew() with another token")
	s.ErrorIs(s.store().Renew(ctx, key("other"), c.Token, time.Second), idempotency.ErrNotOwner, "Renew() of an absent key")
	s.Require().NoError(s.store().Complete(ctx, key("k"), c.Token, sampleRecord(fpA), time.Hour))
	s.ErrorIs(s.store().Renew(ctx, key("k"), c.Token, time.Second), idempotency.ErrNotOwner, "Renew() after Complete")
	s.claimState(key("k"), fpA, time.Second, idempotency.Completed)
}

// TestRecordTTLEnds checks that a record lives for its TTL from completion,
// then the key is free.
func (s *Suite) TestRecordTTLEnds() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Second)
	// The TTL runs from completion and replaces the lease.
	s.Require().NoError(s.store().Complete(ctx, key("k"), c.Token, sampleRecord(fpA), 10*time.Second), "Complete()")
	s.advance(5 * time.Second)
	s.claimState(key("k"), fpA, time.Second, idempotency.Completed)
	s.advance(6 * time.Second)
	s.claimState(key("k"), fpA, time.Second, idempotency.Owned)
}

// TestRecordTooLargeKeepsClaim checks that Complete of a record over
// MaxRecordBytes fails with ErrRecordTooLarge and leaves the claim held, for
// the owner to Release.
func (s *Suite) TestRecordTooLargeKeepsClaim() {
	ctx := context.Background()
	c := s.claim(key("k"), fpA, time.Minute)
	rec := &idempotency.Record{Fingerprint: fpA, ReplyType: "x.Y", Reply: make([]byte, s.h.MaxRecordBytes)}
	s.Require().ErrorIs(s.store().Complete(ctx, key("k"), c.Token, rec, time.Hour), idempotency.ErrRecordTooLarge, "Complete() of a %d-byte record", rec.Size())
	s.claimState(key("k"), fpA, time.Minute, idempotency.InProgress)
	s.Require().NoError(s.store().Release(ctx, key("k"), c.Token), "Release() after ErrRecordTooLarge")
	s.claimState(key("k"), fpA, time.Minute, idempotency.Owned)
}

// TestConcurrentClaimsHaveOneOwner checks that of concurrent Claims of one
// free key exactly one is Owned and the others InProgress.
func (s *Suite) TestConcurrentClaimsHaveOneOwner() {
	const n = 32
	t := s.T() // the goroutines report through t, not through the suite
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		states = map[idempotency.State]int{}
	)
	for range n {
		wg.Go(func() {
			c, err := s.store().Claim(context.Background(), key("k"), fpA, time.Minute)
			if err != nil {
				t.Errorf("Claim() error = %v", err) // not Require: off the test's goroutine
				return
			}
			mu.Lock()
			states[c.State]++
			mu.Unlock()
		})
	}
	wg.Wait()
	s.Equal(map[idempotency.State]int{idempotency.Owned: 1, idempotency.InProgress: n - 1}, states,
		"%d concurrent claims of one key", n)
}

// TestFingerprintsOfAnyLength checks fingerprints of lengths around 32
// bytes: the store keeps its own copy, and fingerprints that differ in their
// last byte or their length differ.
func (s *Suite) TestFingerprintsOfAnyLength() {
	// Around the 32 bytes of a SHA-256: a store may keep short fingerprints
	// differently from long ones. Fingerprints that differ only in their
	// last byte, or only in their length, are different.
	for _, n := range []int{1, 31, 32, 33, 64} {
		s.Run(fmt.Sprint(n), func() {
			k := key(fmt.Sprint("fp-len-", n))
			fp := bytes.Repeat([]byte{0xC3}, n)
			mine := bytes.Clone(fp)
			c := s.claim(k, mine, time.Minute)
			s.Require().Equal(idempotency.Owned, c.State)
			mine[0] ^= 0xFF // the store keeps its own copy
			s.claimState(k, fp, time.Minute, idempotency.InProgress)
			last := bytes.Clone(fp)
			last[n-1]++
			s.claimState(k, last, time.Minute, idempotency.Mismatch)
			s.claimState(k, fp[:n-1], time.Minute, idempotency.Mismatch)
			s.claimState(k, append(bytes.Clone(fp), 0xC3), time.Minute, idempotency.Mismatch)
			s.Require().NoError(s.store().Complete(context.Background(), k, c.Token, sampleRecord(fp), time.Hour), "Complete()")
			s.claimState(k, fp, time.Minute, idempotency.Completed)
			s.claimState(k, last, time.Minute, idempotency.Mismatch)
		})
	}
}

// TestTokensAreNeverReused checks over many claims of one key that no token
// is handed out twice and a stale token never owns the key again.
func (s *Suite) TestTokensAreNeverReused() {
	// Enough claims of one key to cross any batching of tokens a store may
	// do; a stale token never owns the key again.
	const n = 600
	ctx := context.Background()
	seen := make(map[string]bool, n)
	var prev string
	for i := range n {
		c := s.claim(key("k"), fpA, time.Minute)
		s.Require().Equal(idempotency.Owned, c.State)
		if seen[c.Token] {
			s.FailNowf("token reused", "claim %d got token %q again", i, c.Token)
		}
		seen[c.Token] = true
		if prev != "" {
			s.Require().ErrorIs(s.store().Release(ctx, key("k"), prev), idempotency.ErrNotOwner, "Release() with the previous owner's token")
		}
		s.Require().NoError(s.store().Release(ctx, key("k"), c.Token), "Release()")
		prev = c.Token
	}
}

// TestScopeQuotaIsolatesScopes checks, on QuotaStore, that a scope at its
// quota is refused with an error wrapping a *idempotency.FullError (Scope
// true, ErrScopeFull, a RetryAfter within the lease) while another scope
// still claims keys, and that a released key and an ended lease give the
// scope room again.
func (s *Suite) TestScopeQuotaIsolatesScopes() {
	if s.h.QuotaStore == nil {
		s.T().Skip("the store has no per-scope quota")
	}
	ctx := context.Background()
	st, n := s.h.QuotaStore, s.h.QuotaEntries
	in := func(scope string, i int) idempotency.RecordKey {
		return idempotency.RecordKey{Scope: scope, FullMethod: "/resilience.echo.v1.EchoService/Echo", Key: fmt.Sprint("q-", i)}
	}
	claim := func(k idempotency.RecordKey, lease time.Duration) (idempotency.Claim, error) {
		return st.Claim(ctx, k, fpA, lease)
	}
	tokens := make([]string, n)
	for i := range n {
		c, err := claim(in("a", i), time.Minute)
		s.Require().NoError(err, "Claim %d of scope a, within its quota", i)
		s.Require().Equal(idempotency.Owned, c.State)
		tokens[i] = c.Token
	}
	_, err := claim(in("a", n), time.Minute)
	s.Require().ErrorIs(err, idempotency.ErrScopeFull, "Claim past scope a's quota")
	s.Require().ErrorIs(err, idempotency.ErrStoreFull, "Claim past scope a's quota")
	var full *idempotency.FullError
	s.Require().ErrorAs(err, &full)
	s.True(full.Scope, "FullError.Scope")
	s.Greater(full.RetryAfter, time.Duration(0), "FullError.RetryAfter")
	s.LessOrEqual(full.RetryAfter, time.Minute, "FullError.RetryAfter: the oldest lease ends within a minute")

	c, err := claim(in("b", 0), time.Minute)
	s.Require().NoError(err, "Claim of scope b while scope a is at its quota")
	s.Require().Equal(idempotency.Owned, c.State)

	s.Require().NoError(st.Release(ctx, in("a", 0), tokens[0]), "Release()")
	c, err = claim(in("a", n), time.Second)
	s.Require().NoError(err, "Claim of scope a after a release")
	s.Require().Equal(idempotency.Owned, c.State)
	_, err = claim(in("a", n+1), time.Minute)
	s.Require().ErrorIs(err, idempotency.ErrScopeFull, "Claim past scope a's quota again")
	s.advance(time.Second) // the 1 s lease ends
	c, err = claim(in("a", n+1), time.Minute)
	s.Require().NoError(err, "Claim of scope a once a lease has ended")
	s.Require().Equal(idempotency.Owned, c.State)
}

// TestCallsEndWithTheirContext checks the contract's bound: while the
// store's backend answers nothing (Stall), each method returns once its
// context is done, its deadline passed or it was cancelled, well before
// any timeout of the store's own (issue 33: go-redis read on for its 5 s
// read timeout whatever the context said, and a server's lease cutoff
// waited for it), with an error wrapping the context's. A Claim so
// abandoned holds its key no longer than its lease.
func (s *Suite) TestCallsEndWithTheirContext() {
	if s.h.Stall == nil {
		s.T().Skip("the store has no backend that can hang (Harness.Stall is nil)")
	}
	ctx := context.Background()
	held := s.claim(key("held"), fpA, time.Minute) // a token for Complete, Renew and Release
	resume := sync.OnceFunc(s.h.Stall(s.T()))
	defer resume()
	const wait = 200 * time.Millisecond
	// Well under any store's own timeout (go-redis's is 5 s), well over a
	// loaded machine's scheduling delays.
	const within = 2 * time.Second
	ops := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Claim", func(ctx context.Context) error {
			_, err := s.store().Claim(ctx, key("stalled"), fpA, time.Second)
			return err
		}},
		{"Complete", func(ctx context.Context) error {
			return s.store().Complete(ctx, key("held"), held.Token, sampleRecord(fpA), time.Hour)
		}},
		{"Renew", func(ctx context.Context) error { return s.store().Renew(ctx, key("held"), held.Token, time.Minute) }},
		{"Release", func(ctx context.Context) error { return s.store().Release(ctx, key("held"), held.Token) }},
	}
	for _, op := range ops {
		for _, cancelled := range []bool{false, true} {
			var cctx context.Context
			var cancel context.CancelFunc
			want := context.DeadlineExceeded
			if cancelled { // cancelled, with no deadline: a caller gone
				cctx, cancel = context.WithCancel(ctx)
				time.AfterFunc(wait, cancel)
				want = context.Canceled
			} else {
				cctx, cancel = context.WithTimeout(ctx, wait)
			}
			start := time.Now()
			err := op.call(cctx)
			took := time.Since(start)
			cancel()
			if !errors.Is(err, want) || took > within {
				s.Failf("a call must end with its context", "%s with a context %v after %v, the backend stalled: "+
					"returned after %v with %v; want within %v, an error wrapping %v", op.name, want, wait, took, err, within, want)
			}
		}
	}
	// The backend answers again: whatever became of the abandoned Claims
	// of key("stalled") (a lease of a second), the key is free within a
	// few seconds, for any request.
	resume()
	start := time.Now()
	for {
		c, err := s.store().Claim(ctx, key("stalled"), fpB, time.Minute)
		s.Require().NoError(err, "Claim() once the backend answers again")
		if c.State == idempotency.Owned {
			return
		}
		if took := time.Since(start); took > 5*time.Second {
			s.FailNowf("an abandoned Claim holds its key past its lease", "Claim() %v after the backend answered again = %v, want Owned: "+
				"the abandoned Claims had a lease of 1s", took, c.State)
		}
		time.Sleep(20 * time.Millisecond) // Redis's TTLs are on real time
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
