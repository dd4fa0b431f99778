// Package outbox is a transactional outbox for the effects of a call that
// live outside its database: a request to another gRPC service (a payment
// provider, a mail sender, another team's API) is written as a row in the
// transaction of the work that causes it, and a [Relay] delivers it once
// that transaction has committed, at least once, with the row's id as the
// idempotency key of every delivery, so that a receiver with idempotency
// (package server) runs it once.
//
//	// In a handler, joined mode (pgstore.Tx) or not (pgstore.InTx):
//	err := pgstore.InTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO orders ..."); err != nil {
//			return err
//		}
//		_, err := ob.Enqueue(ctx, tx, "/mail.v1.Mailer/Send", &mailv1.SendRequest{...})
//		return err
//	})
//
//	// Once per replica:
//	relay, err := outbox.NewRelay(ob, pool, mailerConn, nil, outbox.RelayConfig{})
//	go relay.Run(ctx)
//
// # What it guarantees
//
// The message exists if and only if the work committed: the same
// transaction writes both. In pgstore's joined mode that transaction is
// also the call's record's, so a retry of the call that replays its
// outcome enqueues nothing again, and a call rolled back sends nothing.
// The relay deletes a message only once the receiver has answered it; a
// relay that dies with messages taken leaves them to be taken again when
// their lease ends (RelayConfig.Lease), by itself once restarted or by a
// relay of another replica; a receiver that is down, slow or overloaded
// fails the delivery, which the relay's client retries (interceptor.Client:
// backoff, a circuit breaker), and the relay again in a later pass, with
// backoff, until it is answered. While the client refuses a method's
// calls (its breaker open: the receiver down), the relay takes none of
// that method's messages until the breaker lets a probe through, and
// counts no attempt for the refusals (Relay.Once). So every message is
// delivered at least once, and often more than once after a crash: the
// receiver's idempotency (the same key on every delivery of a message)
// makes it once. A message
// the receiver refuses for good (a code outside
// RelayConfig.RetryableCodes, such as INVALID_ARGUMENT) is marked dead and
// kept for an operator.
//
// # Outbox, Phase, or neither
//
//   - Neither: the call's effects are all writes to its own database. Joined
//     mode commits them with the call's record: exactly once, nothing more
//     to do.
//   - The outbox: an effect on another service that the call's reply does
//     not wait for (send a mail, notify, charge later, replicate). The call
//     commits at once, holding no connection nor lock while the other
//     service answers; delivery is asynchronous, retried for as long as it
//     takes, and once on a receiver with idempotency.
//   - pgstore.Phase: an effect on another service whose answer the call
//     needs before it replies (a payment's receipt in the reply, a
//     reservation's id). The phase calls out with a key of its own
//     (pgstore.ForeignKey) and commits a recovery point, so a retry after
//     a crash resumes after it; the call holds its transaction, and a pool
//     connection, while it waits. A phased call its caller abandons is
//     finished or failed by a pgstore.Completer.
//
// # Concurrency
//
// An Outbox and a Relay are safe for concurrent use. Relays of many
// replicas share one outbox (each pass takes rows no other relay holds).
// Delivery order is the rows' order within a pass, not across retries.
//
// The table, resilience_outbox, is created by pgstore.Migrate with the
// store's tables, in its schema.
package outbox
