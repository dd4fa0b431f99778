package outbox

import "time"

// HeldMethods returns the methods r holds now (see Relay.Once).
func HeldMethods(r *Relay) []string { return r.heldMethods(time.Now()) }
