package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// Abandoned is a call in phases (see [Phase]) left in progress: its owner
// died after committing a phase, and no retry of the call has resumed it
// since. Its committed phases wait for a retry until WithPhaseRetention
// ends them; a [Completer] finishes or fails it first.
type Abandoned struct {
	// FullMethod and Key are the call's method and idempotency key (its
	// scope is stored only as a hash).
	FullMethod, Key string
	// Phases are the names of the phases committed, in order; Results what
	// each returned.
	Phases  []string
	Results [][]byte
}

// CompleteFunc decides the outcome of an abandoned call. It runs with ctx
// carrying the call's joined transaction, which holds the call's key as a
// retry's would: [Tx] returns it (tx too), its writes commit with the
// outcome, and [Phase] works as in the handler (a phase committed returns
// its recorded result without running; a new one runs, with its
// [ForeignKey]). It returns the call's outcome: a reply, stored as the
// call's success (its message type recorded, as the interceptor records a
// reply), or an error, stored with its status (status.Convert). A retry of
// the call that comes later replays it, as any stored outcome. Returning
// ErrLeave leaves the call as it is, for a later pass.
type CompleteFunc func(ctx context.Context, call Abandoned) (proto.Message, error)

// ErrLeave is returned by a CompleteFunc to leave an abandoned call as it
// is: its transaction is rolled back, and a later pass sees it again.
var ErrLeave = errors.New("pgstore: leave the abandoned call for a later pass")

// CompleterConfig is the configuration of a [Completer]. Zero fields take
// the defaults.
type CompleterConfig struct {
	// Idle is how long a call's last phase must be over (its lease ended)
	// before the call counts as abandoned (default 5 minutes): long enough
	// for a caller's retries, which resume it themselves.
	Idle time.Duration
	// Interval is the time between the passes of Run (default 1 minute).
	Interval time.Duration
	// Batch bounds the calls one pass completes (default 100).
	Batch int
	// TTL is how long an outcome the completer stores is kept (default
	// DefaultPhaseRetention).
	TTL time.Duration
}

// Validate reports a field out of range, naming it.
func (c *CompleterConfig) Validate() error {
	switch {
	case c.Idle < 0:
		return fmt.Errorf("pgstore: CompleterConfig.Idle %v: must not be negative", c.Idle)
	case c.Interval < 0:
		return fmt.Errorf("pgstore: CompleterConfig.Interval %v: must not be negative", c.Interval)
	case c.Batch < 0:
		return fmt.Errorf("pgstore: CompleterConfig.Batch %d: must not be negative", c.Batch)
	case c.TTL < 0:
		return fmt.Errorf("pgstore: CompleterConfig.TTL %v: must not be negative", c.TTL)
	}
	return nil
}

// Completer finishes or fails the abandoned calls of a store in joined
// mode (see Abandoned), instead of leaving their committed phases in
// progress until WithPhaseRetention ends them: a payment made in a "pay"
// phase whose order was never confirmed, say, is confirmed or refunded by
// the CompleteFunc, and the call's outcome stored. Its passes are safe to
// run from many replicas at once: each call is taken as a claim takes it,
// under the key's advisory lock, so one replica, or a retry of the call
// arriving meanwhile, completes it, and the others see it in progress.
type Completer struct {
	j   *JoinedStore    // immutable
	fn  CompleteFunc    // immutable
	cfg CompleterConfig // with defaults; immutable
}

// NewCompleter returns a Completer of j's abandoned calls, which fn
// completes. It does not start: call Run (in a goroutine of its own) or
// Once.
func NewCompleter(j *JoinedStore, fn CompleteFunc, cfg CompleterConfig) (*Completer, error) {
	switch {
	case j == nil || j.Store == nil:
		return nil, errors.New("pgstore: NewCompleter: store must not be nil")
	case fn == nil:
		return nil, errors.New("pgstore: NewCompleter: fn must not be nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Idle = cmp.Or(cfg.Idle, 5*time.Minute)
	cfg.Interval = cmp.Or(cfg.Interval, time.Minute)
	cfg.Batch = cmp.Or(cfg.Batch, 100)
	cfg.TTL = cmp.Or(cfg.TTL, DefaultPhaseRetention)
	return &Completer{j: j, fn: fn, cfg: cfg}, nil
}

// Run runs a pass every Interval until ctx ends, and returns ctx's error.
// A pass that fails is logged (the store's logger) and tried again at the
// next interval.
func (c *Completer) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := c.Once(ctx); err != nil && ctx.Err() == nil {
			c.j.opts.logger.Warn("pgstore: completing abandoned calls failed; trying again at the next interval", "error", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Once runs one pass: it lists up to Batch abandoned calls, and completes
// each in a transaction that claims it (see CompleteFunc). It returns how
// many it completed, and the first error of a call's claim or commit (it
// goes on with the others; a call whose fn panicked, or whose outcome
// cannot be recorded, is logged and left).
func (c *Completer) Once(ctx context.Context) (int, error) {
	rows, err := c.j.pool.Query(ctx, c.j.sql.abandoned, millis(c.cfg.Idle), int32(c.cfg.Batch))
	if err != nil {
		return 0, fmt.Errorf("pgstore: listing abandoned calls: %w", err)
	}
	type candidate struct {
		k  recordKey
		fp []byte
	}
	var calls []candidate
	for rows.Next() {
		var cd candidate
		if err := rows.Scan(&cd.k.id, &cd.k.scope, &cd.k.part, &cd.fp, &cd.k.rk.FullMethod, &cd.k.rk.Key); err != nil {
			rows.Close()
			return 0, fmt.Errorf("pgstore: listing abandoned calls: %w", err)
		}
		calls = append(calls, cd)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("pgstore: listing abandoned calls: %w", err)
	}
	var (
		n     int
		first error
	)
	for _, cd := range calls {
		done, err := c.complete(ctx, &cd.k, cd.fp)
		if done {
			n++
		}
		if err != nil && first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return n, first
}

// complete claims one abandoned call, runs fn and commits its outcome.
func (c *Completer) complete(ctx context.Context, k *recordKey, fp []byte) (bool, error) {
	j := c.j
	conn, err := j.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("pgstore: completing an abandoned call: %w", err)
	}
	if conn, err = j.takeSlot(ctx, conn, k); err != nil {
		return false, err
	}
	_, owned, _, err := j.claimOn(ctx, conn, k, fp, j.opts.lockTimeout, 1)
	if owned == nil {
		j.slots.put(k.scope)
		conn.Release()
		if err != nil {
			return false, fmt.Errorf("pgstore: completing an abandoned call: %w", err)
		}
		return false, nil // completed, resumed or taken meanwhile
	}
	t := owned.(*txn)
	if len(t.resumed) == 0 { // not the abandoned row: it ended or went since the listing
		_ = t.Rollback(ctx)
		return false, nil
	}
	call := Abandoned{FullMethod: k.rk.FullMethod, Key: k.rk.Key, Phases: t.resumed}
	for _, name := range t.resumed {
		call.Results = append(call.Results, t.phases[name])
	}
	reply, ferr := c.run(t.Context(ctx), call)
	if errors.Is(ferr, ErrLeave) {
		return false, t.Rollback(ctx)
	}
	rec, err := completedRecord(fp, reply, ferr)
	if err != nil {
		_ = t.Rollback(ctx)
		j.opts.logger.Error("pgstore: the outcome of an abandoned call cannot be recorded; left for a later pass",
			"method", k.rk.FullMethod, "error", err)
		return false, nil
	}
	if err := t.Commit(ctx, rec, c.cfg.TTL); err != nil {
		return false, fmt.Errorf("pgstore: completing an abandoned call: %w", err)
	}
	return true, nil
}

// run runs fn, a panic turned into an error.
func (c *Completer) run(ctx context.Context, call Abandoned) (reply proto.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			reply, err = nil, fmt.Errorf("%w: the CompleteFunc panicked: %v", ErrLeave, r)
			c.j.opts.logger.Error("pgstore: completing an abandoned call panicked; left for a later pass",
				"method", call.FullMethod, "panic", r)
		}
	}()
	return c.fn(ctx, call)
}

// completedRecord is the record of an outcome: reply, or err's status.
func completedRecord(fp []byte, reply proto.Message, err error) (*idempotency.Record, error) {
	if err != nil {
		st := status.Convert(err)
		p := st.Proto()
		return &idempotency.Record{Fingerprint: fp, Code: st.Code(), Message: st.Message(), Details: p.GetDetails()}, nil
	}
	if reply == nil {
		return nil, errors.New("a nil reply and a nil error")
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(reply)
	if err != nil {
		return nil, err
	}
	return &idempotency.Record{Fingerprint: fp, Code: codes.OK, ReplyType: string(reply.ProtoReflect().Descriptor().FullName()),
		Reply: data}, nil
}
