package idempotency

// SetHash makes s hash record keys with h, so that tests can force
// collisions. Call it before the first Claim.
func SetHash(s *MemoryStore, h func(RecordKey) uint64) { s.testHash = h }
