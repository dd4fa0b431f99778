package pgstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrNotJoined is returned by [Phase] when its context is not a keyed
// call's in joined mode (see [Tx]).
var ErrNotJoined = errors.New("pgstore: not in a joined transaction (a keyed call's handler with the store in joined mode)")

// ErrClaimLost is returned by [Phase] when the call's row was taken over by
// another owner since the phase began (the owner's session had ended:
// WithTxIdleTimeout). The handler should return it: nothing more of its
// work commits.
var ErrClaimLost = errors.New("pgstore: the call's row was taken over by another owner")

// ErrNestedPhase is returned by a [Phase] called while another Phase of
// the same call runs (inside its fn, or from another goroutine): the inner
// commit would take the outer phase's writes so far with it, and a retry
// of the failed outer phase would make them again.
var ErrNestedPhase = errors.New("pgstore: a Phase inside another Phase of the same call")

// maxPhaseName bounds a phase's name.
const maxPhaseName = 128

// Phase runs fn as the phase name of the keyed call whose handler's
// context is ctx, in joined mode, and commits it: fn's writes (through tx,
// the call's transaction) and a recovery point, the phase's name and the
// bytes fn returns, are committed together before Phase returns. A retry
// of the call (same key, same request) that finds the phase committed,
// after the process that ran it died, does not run fn again: Phase returns
// the bytes it returned then. So a handler made of phases resumes after
// the last one committed, as Stripe's atomic phases do.
//
// Use phases for work that spans steps that must not be redone once done,
// above all a call to a foreign API between two writes: a phase makes the
// call with an idempotency key of its own ([ForeignKey]), derived from the
// call's key and the phase's name, so the foreign API deduplicates the
// call when a retry runs the phase again (the process died before the
// phase committed), and, once the phase commits, the call is not made
// again. What follows the last phase commits with the call's record, as
// without phases.
//
// Each phase costs two round trips (its commit, then the next
// transaction's begin, which takes the row's lock again): between phases,
// the row is visible, in progress, with its lease renewed; a duplicate then
// waits on the row's lock (WithLockTimeout) and gets ABORTED, and, once the
// owner has died and its lease has ended, takes the row over and resumes.
// An outcome that is an error undoes the writes made since the last phase;
// committed phases stay. A call rolled back (an unstored code, a panic)
// ends its lease, so its retry resumes at once.
//
// Names are unique within a call, 1 to 128 bytes. Phases do not nest: a
// Phase called while another of the same call runs returns
// ErrNestedPhase. If fn returns an error, Phase returns it and commits
// nothing of the phase yet: fn's writes stay in the transaction, and the
// handler should return an error, which undoes them (a handler that goes
// on and succeeds commits them with its record; to drop them, run fn's
// writes in a savepoint, tx.Begin). Without a joined transaction in ctx,
// Phase returns ErrNotJoined and does not run fn.
func Phase(ctx context.Context, name string, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) ([]byte, error) {
	v, ok := ctx.Value(txKey{}).(*joinedTx)
	if !ok {
		return nil, ErrNotJoined
	}
	if name == "" || len(name) > maxPhaseName {
		return nil, fmt.Errorf("pgstore: Phase(%q): a name must be 1 to %d bytes", name, maxPhaseName)
	}
	t := v.t
	t.mu.Lock()
	res, done := t.phases[name]
	err, nested := t.bad, t.inPhase
	if !done && err == nil && !nested {
		t.inPhase = true
	}
	t.mu.Unlock()
	switch {
	case nested:
		return nil, ErrNestedPhase
	case done:
		return res, nil
	case err != nil:
		return nil, err
	}
	defer func() {
		t.mu.Lock()
		t.inPhase = false
		t.mu.Unlock()
	}()
	res, err = fn(context.WithValue(ctx, phaseKey{}, foreignKey(&t.k, name)), v)
	if err != nil {
		return nil, err
	}
	if err := t.commitPhase(ctx, name, res); err != nil {
		return nil, err
	}
	return res, nil
}

type phaseKey struct{}

// ForeignKey returns the idempotency key for a call to a foreign API made
// inside a phase (ctx is the one Phase gives fn): the same for every run of
// that phase of that call (the call's scope, method and key, and the
// phase's name), and different for any other phase or call. It is 43
// characters of base64url (SHA-256). ok is false outside a phase.
func ForeignKey(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(phaseKey{}).(string)
	return key, ok
}

func foreignKey(k *recordKey, phase string) string {
	h := sha256.New()
	h.Write([]byte("resilience.pgstore.phase\x00"))
	h.Write(k.id)
	h.Write([]byte(phase))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// commitPhase commits the current transaction with the phase's recovery
// point, and begins the next one, which takes the key's advisory lock
// again, in one pipeline (one round trip). On error the txn can only roll
// back (t.bad). The handler's statements wait meanwhile (see
// joined_gate.go).
func (t *txn) commitPhase(ctx context.Context, name string, res []byte) error {
	c, e, err := t.exclusive()
	if err != nil {
		return t.fail(fmt.Errorf("pgstore: committing phase %q: %w", name, err))
	}
	defer t.endExclusive()
	switch {
	case e.ended:
		return t.fail(fmt.Errorf("pgstore: committing phase %q: %w", name, ErrTxEnded))
	case e.bad != nil:
		return e.bad
	}
	j := t.j
	b := &pgx.Batch{}
	b.Queue(j.sql.phaseJoined, t.k.id, t.token, e.xid, name, res, millis(t.lease), millis(j.opts.phaseRetention))
	b.Queue("COMMIT")
	b.Queue(j.sql.begin)
	b.Queue(j.sql.relock, t.k.id, t.token, millis(j.opts.lockTimeout), j.opts.txIdleTimeout.Milliseconds(),
		j.opts.connCheck.Milliseconds())
	b.Queue("SAVEPOINT " + savepoint)
	br := c.SendBatch(ctx, b)
	_, phaseErr := br.Exec()
	tag, commitErr := br.Exec()
	if phaseErr == nil && commitErr == nil && tag.String() == "ROLLBACK" {
		commitErr = pgx.ErrTxCommitRollback
	}
	var xid *int64
	_, beginErr := br.Exec()
	relockErr := br.QueryRow().Scan(&xid)
	_, spErr := br.Exec()
	closeErr := br.Close()
	if err := cmp.Or(phaseErr, commitErr); err != nil {
		// The phase did not commit (or, the connection broken, may have:
		// its retry finds out, as for any commit).
		j.rollback(ctx, c)
		if isEndedByHandler(err) {
			t.mu.Lock()
			t.ended = true
			t.mu.Unlock()
			err = ErrTxEnded
		}
		return t.fail(fmt.Errorf("pgstore: committing phase %q: %w", name, err))
	}
	t.mu.Lock()
	t.gen++
	if t.phases == nil {
		t.phases = make(map[string][]byte)
	}
	t.phases[name] = res
	t.mu.Unlock()
	switch err := cmp.Or(beginErr, relockErr, spErr, closeErr); {
	case isLockTimeout(err) || err == nil && xid == nil:
		// Another claim took the key over in the moment between the commit
		// and the lock (the owner seemed gone), or has it since.
		j.rollback(ctx, c)
		return t.fail(ErrClaimLost)
	case err != nil:
		j.rollback(ctx, c)
		return t.fail(fmt.Errorf("pgstore: beginning the transaction after phase %q: %w", name, err))
	}
	t.mu.Lock()
	t.xid = *xid
	t.mu.Unlock()
	return nil
}

// fail marks the txn as one that can only roll back, and returns err.
func (t *txn) fail(err error) error {
	t.mu.Lock()
	if t.bad == nil {
		t.bad = err
	}
	t.mu.Unlock()
	return err
}
