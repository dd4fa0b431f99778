package idempotency

import (
	"context"
	"errors"
	"time"
)

// RecordKey names one record: the caller's scope, the method and the
// idempotency key the caller sent. Two calls share a record only when all
// three are equal, so a caller in one scope never reads another's record.
type RecordKey struct {
	// Scope identifies the caller, such as an authenticated principal. The
	// empty scope is the one server.SharedScope gives every caller.
	Scope string
	// FullMethod is the gRPC method, "/package.Service/Method".
	FullMethod string
	// Key is the value of the call's idempotency-key metadata: 1 to 255
	// printable ASCII characters.
	Key string
}

// State is what [Store.Claim] found.
type State uint8

// The outcomes of [Store.Claim].
const (
	// Owned: the key was free and now belongs to the caller, under a lease,
	// until it calls Complete or Release with Claim.Token or the lease ends.
	Owned State = iota + 1
	// Completed: a record with the same fingerprint is stored; Claim.Record
	// holds it.
	Completed
	// InProgress: another owner holds a live lease with the same fingerprint;
	// Claim.RetryAfter is the time left on that lease, an upper bound on how
	// long the key stays busy if the owner has crashed.
	InProgress
	// Mismatch: the key is held (in progress or completed) for a request with
	// another fingerprint. Nothing is returned of the other request.
	Mismatch
)

// String returns the state's name, such as "Owned".
func (s State) String() string {
	switch s {
	case Owned:
		return "Owned"
	case Completed:
		return "Completed"
	case InProgress:
		return "InProgress"
	case Mismatch:
		return "Mismatch"
	}
	return "State(invalid)"
}

// Claim is the result of [Store.Claim].
type Claim struct {
	// State is what the store found; the other fields depend on it.
	State State
	// Token is the owner token, set when State is Owned. Complete and Release
	// take it; a store never hands the same token out twice for one key.
	Token string
	// Record is the stored outcome, set when State is Completed. It is
	// shared: callers must not modify it.
	Record *Record
	// RetryAfter is the time left on the owner's lease, set when State is
	// InProgress.
	RetryAfter time.Duration
}

// Store keeps idempotency records. Implementations are safe for concurrent
// use, by many goroutines and, for a shared store such as Redis, by many
// processes. Every operation on one key is atomic (linearizable).
//
// A key is absent, held under a lease by one owner (in progress), or
// completed with a record. Transitions:
//
//	absent      --Claim-->    in progress (lease, owner token, fingerprint)
//	in progress --Renew-->    in progress, with a new lease; only by the owner
//	in progress --Complete--> completed (record, TTL); only by the owner
//	absent      --Complete--> completed; by the owner whose lease ended
//	in progress --Release-->  absent; only by the owner
//	in progress --lease ends--> absent
//	completed   --TTL ends or evicted--> absent
//
// Waiting for an owner is the caller's loop: Claim again until the result
// is not InProgress. A Claim that finds the key free takes it over, so a
// waiter becomes the owner when the first owner released the key or its lease
// ended.
//
// Every method is bounded by its context: one still waiting for its
// backend when ctx is done (its deadline passed or it was cancelled)
// returns then, whatever the backend does (a partition, a server that
// stopped answering), with an error wrapping ctx.Err(); a store may take a
// short, bounded time more to undo a Claim whose outcome it cannot know
// (the Redis and PostgreSQL stores: about 500 ms). A store that answers
// without waiting (the memory store) may answer a done ctx. The
// interceptor relies on it to bound a call's wait for its claim and the
// store calls after a handler; a lease's cutoff does not rely on it (the
// server cancels a handler whose lease was not renewed in time on its own
// clock). An operation cut short by its context has an unknown effect, as
// after any error: a Claim's key then ends with its lease at the latest.
// The conformance suite (package storetest) checks the bound against a
// backend that hangs.
type Store interface {
	// Claim takes key for the request whose fingerprint is given, under a
	// lease of the given duration, when the key is absent (or its lease or
	// record has ended): the result is Owned with a fresh token. Otherwise
	// it reports what holds the key: Mismatch when the fingerprint differs,
	// else Completed with the record, else InProgress. The fingerprint check
	// comes first, so a different request never learns anything of the
	// stored one. An error means the store could not answer; the key is then
	// not held by the caller.
	Claim(ctx context.Context, key RecordKey, fingerprint []byte, lease time.Duration) (Claim, error)

	// Complete stores rec for key for ttl and ends the lease, in one atomic
	// step, if token still owns key, or if key is absent (the owner's lease
	// ended and no one has claimed key since: the call ran, and its outcome
	// is the key's; rec.Fingerprint then becomes the key's fingerprint).
	// Otherwise (another owner holds key, or a record is stored) it returns
	// an error wrapping ErrNotOwner and changes nothing. A record larger than the store's bound
	// is refused with an error wrapping ErrRecordTooLarge, and the claim is
	// kept, so the caller should Release. The store may keep rec: the caller
	// must not modify it afterwards.
	Complete(ctx context.Context, key RecordKey, token string, rec *Record, ttl time.Duration) error

	// Renew sets the lease of token on key to end lease from now, if token
	// still owns key; otherwise it returns an error wrapping ErrNotOwner and
	// changes nothing. The owner of a long call renews its lease while the
	// call runs, so that a lease need not outlast the slowest call.
	Renew(ctx context.Context, key RecordKey, token string, lease time.Duration) error

	// Release ends the lease of token on key and makes key absent, if token
	// still owns it; otherwise it returns an error wrapping ErrNotOwner and
	// changes nothing. Callers release after a failure worth retrying, so that
	// the retry runs the call again.
	Release(ctx context.Context, key RecordKey, token string) error
}

var (
	// ErrNotOwner is wrapped by the errors of Complete and Release when the
	// token no longer owns the key: its lease ended, the key was released, or
	// another owner claimed it since.
	ErrNotOwner = errors.New("idempotency: token does not own the key")

	// ErrRecordTooLarge is wrapped by the error of Complete when the record
	// is larger than the store's bound.
	ErrRecordTooLarge = errors.New("idempotency: record too large for the store")

	// ErrStoreFull is wrapped by the error of a Claim refused for room: a
	// [*FullError].
	ErrStoreFull = errors.New("idempotency: store full")

	// ErrScopeFull is wrapped, with ErrStoreFull, by the error of a Claim
	// refused because the caller's scope holds its quota (see
	// WithScopeQuota): a [*FullError] whose Scope is true.
	ErrScopeFull = errors.New("idempotency: scope quota full")
)

// FullError is the error of a Claim that the store refused for room: live
// leases and records it may not yet evict fill it, or fill the caller's
// scope's quota. Nothing was claimed or evicted for it. errors.Is matches
// ErrStoreFull, and ErrScopeFull when Scope is true; the interceptor answers
// RESOURCE_EXHAUSTED with a RetryInfo of RetryAfter.
type FullError struct {
	// Scope is true when the caller's scope's quota is what is full; other
	// scopes may still claim keys.
	Scope bool
	// RetryAfter is when room may come: the oldest record passes its minimum
	// retention or the oldest lease ends. It is a hint, not a promise.
	RetryAfter time.Duration

	msg string
}

// Error returns a description of what is full, without the scope's name.
func (e *FullError) Error() string {
	what := ErrStoreFull.Error()
	if e.Scope {
		what = ErrScopeFull.Error()
	}
	if e.msg == "" {
		return what
	}
	return what + ": " + e.msg
}

// Unwrap returns ErrStoreFull, and ErrScopeFull when Scope is true.
func (e *FullError) Unwrap() []error {
	if e.Scope {
		return []error{ErrScopeFull, ErrStoreFull}
	}
	return []error{ErrStoreFull}
}
