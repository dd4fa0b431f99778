package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestCompleterFinishesAnAbandonedPhasedCall (finding 9): a call whose
// owner died after its "pay" phase, and that its caller abandoned, waited
// 24 h (WithPhaseRetention) in progress. A Completer takes it over once it
// has been idle for its Idle, as a retry would: the committed phase returns
// its recorded result without running, the next phases run, and the
// outcome it returns is stored: a late retry replays it, and nothing ran
// twice. A call whose owner lives, or not idle long enough, is left alone,
// and so is one its CompleteFunc leaves (ErrLeave) or panics on: its
// transaction rolled back, its key free for the next pass.
func TestCompleterFinishesAnAbandonedPhasedCall(t *testing.T) {
	pool, schema := migrated(t)
	ctx := context.Background()
	steps := pgtest.Ident(schema) + ".steps"
	if _, err := pool.Exec(ctx, "CREATE TABLE "+steps+" (key text, step text)"); err != nil {
		t.Fatal(err)
	}
	j, _ := joinedStore(t, pgtest.DSN(t), schema, nil)
	api := &foreignAPI{}
	pay := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		key, _ := pgstore.ForeignKey(ctx)
		api.charge(key)
		_, err := tx.Exec(ctx, "INSERT INTO "+steps+" VALUES ('k', 'pay')")
		return []byte("receipt-1"), err
	}
	// The first execution: the "pay" phase commits, then the owner dies.
	cl, txn, err := j.ClaimTx(ctx, rk("k"), fp, time.Millisecond) // its lease ends at once: only its lock says it lives
	if err != nil || cl.State != idempotency.Owned {
		t.Fatalf("ClaimTx() = %v, %v", cl.State, err)
	}
	hctx := txn.Context(ctx)
	if _, err := pgstore.Phase(hctx, "pay", pay); err != nil {
		t.Fatal(err)
	}
	tx, _ := pgstore.Tx(hctx)
	var panics, leave, finish int
	fn := func(ctx context.Context, call pgstore.Abandoned) (proto.Message, error) {
		if call.Key != "k" || len(call.Phases) != 1 || call.Phases[0] != "pay" || string(call.Results[0]) != "receipt-1" {
			t.Errorf("Abandoned = %+v, want key k after its pay phase", call)
		}
		if panics > 0 {
			panics--
			panic("a bug of the CompleteFunc")
		}
		if leave > 0 {
			leave--
			return nil, pgstore.ErrLeave
		}
		finish++
		receipt, err := pgstore.Phase(ctx, "pay", pay) // committed: its result, without running
		if err != nil {
			return nil, err
		}
		tx, _ := pgstore.Tx(ctx)
		if _, err := tx.Exec(ctx, "INSERT INTO "+steps+" VALUES ('k', 'confirm')"); err != nil {
			return nil, err
		}
		return &echov1.EchoResponse{Message: "completed " + string(receipt)}, nil
	}
	eager, err := pgstore.NewCompleter(j, fn, pgstore.CompleterConfig{Idle: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := eager.Once(ctx); err != nil || n != 0 || finish != 0 {
		t.Fatalf("Once() with the owner alive (between phases, its lease over) = %d, %v, ran %d; want it left", n, err, finish)
	}
	comp, err := pgstore.NewCompleter(j, fn, pgstore.CompleterConfig{Idle: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	terminate(t, pool, tx) // the owner dies; its caller never retries
	deadline := time.Now().Add(10 * time.Second)
	for { // the terminated backend's end takes a moment
		if n, err := comp.Once(ctx); err != nil || n != 0 || finish != 0 {
			t.Fatalf("Once() before the call is idle = %d, %v; want it left", n, err)
		}
		var free bool
		if err := pool.QueryRow(ctx, "SELECT pg_try_advisory_lock_shared("+pgtest.Ident(schema)+".resilience_idem_lock_key(id)) FROM "+
			pgtest.Ident(schema)+".resilience_idempotency WHERE key = 'k'").Scan(&free); err != nil {
			t.Fatal(err)
		}
		if free {
			_, _ = pool.Exec(ctx, "SELECT pg_advisory_unlock_all()")
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead owner's lock is still held after 10s")
		}
		time.Sleep(10 * time.Millisecond) // the session's end
	}
	_ = txn.Rollback(ctx)
	advance(t, pool, schema, time.Minute) // idle past the completer's Idle
	leave = 1
	if n, err := comp.Once(ctx); err != nil || n != 0 {
		t.Fatalf("Once() whose fn leaves the call = %d, %v, want 0", n, err)
	}
	panics = 1
	if n, err := comp.Once(ctx); err != nil || n != 0 {
		t.Fatalf("Once() whose fn panics = %d, %v, want 0: the call left as it was", n, err)
	}
	if n, err := comp.Once(ctx); err != nil || n != 1 {
		t.Fatalf("Once() = %d, %v, want the abandoned call completed", n, err)
	}
	if n, err := comp.Once(ctx); err != nil || n != 0 {
		t.Fatalf("Once() again = %d, %v, want nothing left", n, err)
	}
	cl, _, err = j.ClaimTx(ctx, rk("k"), fp, time.Minute)
	if err != nil || cl.State != idempotency.Completed || cl.Record.ReplyType != "resilience.echo.v1.EchoResponse" {
		t.Fatalf("a late retry's ClaimTx() = %v, %+v, %v; want the completer's outcome", cl.State, cl.Record, err)
	}
	var reply echov1.EchoResponse
	if err := proto.Unmarshal(cl.Record.Reply, &reply); err != nil || reply.Message != "completed receipt-1" {
		t.Errorf("stored reply = %q, %v", reply.Message, err)
	}
	for _, step := range []string{"pay", "confirm"} {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+steps+" WHERE step = $1", step).Scan(&n); err != nil || n != 1 {
			t.Errorf("rows of step %s = %d, %v; want 1", step, n, err)
		}
	}
	if api.calls != 1 {
		t.Errorf("foreign calls = %d, want 1", api.calls)
	}
}

// TestNewCompleterRefusesBadConfig names what is wrong.
func TestNewCompleterRefusesBadConfig(t *testing.T) {
	_, schema := migrated(t)
	j, _ := joinedStore(t, pgtest.DSN(t), schema, nil)
	fn := func(context.Context, pgstore.Abandoned) (proto.Message, error) { return nil, pgstore.ErrLeave }
	tests := []struct {
		name string
		j    *pgstore.JoinedStore
		fn   pgstore.CompleteFunc
		cfg  pgstore.CompleterConfig
	}{
		{"NilStore", nil, fn, pgstore.CompleterConfig{}},
		{"NilFunc", j, nil, pgstore.CompleterConfig{}},
		{"NegativeIdle", j, fn, pgstore.CompleterConfig{Idle: -1}},
		{"NegativeBatch", j, fn, pgstore.CompleterConfig{Batch: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := pgstore.NewCompleter(tt.j, tt.fn, tt.cfg); err == nil {
				t.Errorf("NewCompleter() = nil error, want one")
			}
		})
	}
}
