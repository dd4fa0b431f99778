package pgstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// txSlots bounds the joined transactions open at once (see
// WithJoinedTxLimit): each holds a pool connection while its handler runs,
// so that one scope's slow calls cannot take every connection, and some
// are always left for lookups (a replay is one). A claim past a bound waits
// for a slot, holding no connection, up to the lock timeout (and half the
// caller's time left), then is refused: a burst of fast calls queues for a
// moment; slow calls that hold their slots turn the claims past them away,
// with a retry hint, within the callers' deadlines.
type txSlots struct {
	perScope, total int           // immutable
	retryAfter      time.Duration // the refusal's hint, and the bound of a wait: the lock timeout; immutable

	mu      sync.Mutex
	open    int            // in all
	byScope map[string]int // by scope hash; an entry only while its scope has one open, so at most total entries
	freed   chan struct{}  // closed, and replaced, when a slot is given back while claims wait; nil when none waits
}

// take counts a joined transaction of scope about to begin, or refuses it
// with an *idempotency.FullError (Scope true when scope's share is what is
// full), at once. Each take that succeeds has one put.
func (s *txSlots) take(scope []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.takeLocked(scope)
	return err
}

// takeLocked is take with s.mu held; freed is the channel a waiter waits
// on when it is refused.
func (s *txSlots) takeLocked(scope []byte) (freed <-chan struct{}, err error) {
	n := s.byScope[string(scope)]
	switch {
	case n >= s.perScope:
		err = fmt.Errorf("pgstore: claim: the caller's scope has %d joined transactions open, its bound (WithJoinedTxLimit): %w",
			n, &idempotency.FullError{Scope: true, RetryAfter: s.retryAfter})
	case s.open >= s.total:
		err = fmt.Errorf("pgstore: claim: %d joined transactions open, the bound of all scopes (WithJoinedTxLimit): %w",
			s.open, &idempotency.FullError{RetryAfter: s.retryAfter})
	}
	if err != nil {
		if s.freed == nil {
			s.freed = make(chan struct{})
		}
		return s.freed, err
	}
	if s.byScope == nil {
		s.byScope = make(map[string]int)
	}
	s.byScope[string(scope)] = n + 1
	s.open++
	return nil, nil
}

// wait takes a slot for scope, waiting for one to be given back up to the
// lock timeout, and half of what is left of ctx's deadline, so that a
// caller whose slots stay held (slow calls) gets the refusal and its retry
// hint in time, not its deadline; past it, it returns take's refusal.
func (s *txSlots) wait(ctx context.Context, scope []byte) error {
	limit := s.retryAfter
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl)/2)
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		s.mu.Lock()
		freed, err := s.takeLocked(scope)
		s.mu.Unlock()
		if err == nil {
			return nil
		}
		select {
		case <-freed:
		case <-timer.C:
			return err
		case <-ctx.Done():
			return err
		}
	}
}

// put ends what take counted, and wakes the claims waiting for a slot.
func (s *txSlots) put(scope []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.byScope[string(scope)] - 1; n > 0 {
		s.byScope[string(scope)] = n
	} else {
		delete(s.byScope, string(scope))
	}
	s.open--
	if s.freed != nil {
		close(s.freed)
		s.freed = nil
	}
}

// joinedTxDefaults returns the default bounds of WithJoinedTxLimit for a
// pool of maxConns: half the pool per scope, all of it but a quarter in
// all (at least 1 each).
func joinedTxDefaults(maxConns int) (perScope, total int) {
	return max(maxConns/2, 1), max(maxConns-max(maxConns/4, 1), 1)
}
