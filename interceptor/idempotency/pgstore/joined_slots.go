package pgstore

import (
	"fmt"
	"sync"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// txSlots bounds the joined transactions open at once (see
// WithJoinedTxLimit): each holds a pool connection while its handler runs,
// so that one scope's slow calls cannot take every connection, and some
// are always left for lookups (a replay is one).
type txSlots struct {
	perScope, total int           // immutable
	retryAfter      time.Duration // the refusal's hint: the lock timeout; immutable

	mu      sync.Mutex
	open    int            // in all
	byScope map[string]int // by scope hash; an entry only while its scope has one open, so at most total entries
}

// take counts a joined transaction of scope about to begin, or refuses it
// with an *idempotency.FullError (Scope true when scope's share is what is
// full). Each take that succeeds has one put.
func (s *txSlots) take(scope []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.byScope[string(scope)]
	switch {
	case n >= s.perScope:
		return fmt.Errorf("pgstore: claim: the caller's scope has %d joined transactions open, its bound (WithJoinedTxLimit): %w",
			n, &idempotency.FullError{Scope: true, RetryAfter: s.retryAfter})
	case s.open >= s.total:
		return fmt.Errorf("pgstore: claim: %d joined transactions open, the bound of all scopes (WithJoinedTxLimit): %w",
			s.open, &idempotency.FullError{RetryAfter: s.retryAfter})
	}
	if s.byScope == nil {
		s.byScope = make(map[string]int)
	}
	s.byScope[string(scope)] = n + 1
	s.open++
	return nil
}

// put ends what take counted.
func (s *txSlots) put(scope []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.byScope[string(scope)] - 1; n > 0 {
		s.byScope[string(scope)] = n
	} else {
		delete(s.byScope, string(scope))
	}
	s.open--
}

// joinedTxDefaults returns the default bounds of WithJoinedTxLimit for a
// pool of maxConns: half the pool per scope, all of it but a quarter in
// all (at least 1 each).
func joinedTxDefaults(maxConns int) (perScope, total int) {
	return max(maxConns/2, 1), max(maxConns-max(maxConns/4, 1), 1)
}
