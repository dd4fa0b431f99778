package outbox

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
)

// Outbox is the outbox table of one schema (pgstore.Migrate creates it
// with the store's tables). Its methods are safe for concurrent use.
type Outbox struct {
	schema string     // immutable
	sql    statements // immutable
}

// New returns the outbox of schema (pgstore.DefaultSchema when empty). It
// does not contact PostgreSQL.
func New(schema string) (*Outbox, error) {
	if schema == "" {
		schema = pgstore.DefaultSchema
	}
	if len(schema) > 63 || strings.ContainsRune(schema, 0) {
		return nil, fmt.Errorf("outbox: New(%q): a PostgreSQL identifier is at most 63 bytes, without NUL", schema)
	}
	return &Outbox{schema: schema, sql: newStatements(schema)}, nil
}

// statements are the outbox's SQL, schema-qualified.
type statements struct {
	insert, take, ack, retry, dead, release string
}

func newStatements(schema string) statements {
	t := pgx.Identifier{schema, "resilience_outbox"}.Sanitize()
	return statements{
		insert: "INSERT INTO " + t + " (id, method, payload) VALUES ($1, $2, $3)",
		// A relay takes the due rows, oldest first, skipping those another
		// relay is taking and those of the methods it holds ($3, see
		// Relay.Once), and holds them for its lease (next_at).
		take: "UPDATE " + t + " o SET next_at = statement_timestamp() + $2 * interval '1 millisecond', attempts = o.attempts + 1 " +
			"FROM (SELECT seq FROM " + t + " WHERE dead_at IS NULL AND next_at <= statement_timestamp() AND method <> ALL($3::text[]) " +
			"ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED) due WHERE o.seq = due.seq " +
			"RETURNING o.seq, o.id, o.method, o.payload, o.attempts, o.created_at",
		ack:     "DELETE FROM " + t + " WHERE seq = $1",
		retry:   "UPDATE " + t + " SET next_at = statement_timestamp() + $3 * interval '1 millisecond', last_error = $4 WHERE seq = $1 AND attempts = $2",
		dead:    "UPDATE " + t + " SET dead_at = statement_timestamp(), last_error = $3 WHERE seq = $1 AND attempts = $2",
		release: "UPDATE " + t + " SET next_at = statement_timestamp() + $3 * interval '1 millisecond', attempts = attempts - 1 WHERE seq = $1 AND attempts = $2",
	}
}

// Message is a row of the outbox, as a Relay delivers it.
type Message struct {
	// ID is the message's id: the idempotency key of every delivery of it,
	// 22 characters of base64url (128 random bits).
	ID string
	// FullMethod is the unary method it is a request of,
	// "/package.Service/Method".
	FullMethod string
	// Payload is the request, marshalled.
	Payload []byte
	// Attempts counts the deliveries begun, this one included.
	Attempts int
	// CreatedAt is when it was written, by the database's clock.
	CreatedAt time.Time

	seq int64
}

// Enqueue writes req, a request of the unary method fullMethod, to the
// outbox in tx, and returns its id, the idempotency key of its delivery. A
// Relay delivers it once tx has committed, and never if tx rolls back: tx
// is the transaction of the work that sends it, such as a keyed call's
// joined transaction ([pgstore.Tx], [pgstore.InTx]), so that the message
// and the work commit together, and a retry of the call that replays its
// outcome sends nothing again.
//
// The method must be known to the protobuf registry (its generated code
// linked in), unary, and take req's type: a mistyped name is refused here,
// not at delivery.
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, fullMethod string, req proto.Message) (string, error) {
	md, err := lookupMethod(fullMethod)
	if err != nil {
		return "", err
	}
	if req == nil {
		return "", errors.New("outbox: Enqueue: a nil request")
	}
	if got := req.ProtoReflect().Descriptor().FullName(); got != md.Input().FullName() {
		return "", fmt.Errorf("outbox: Enqueue(%q): a request of type %s, want %s", fullMethod, got, md.Input().FullName())
	}
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("outbox: Enqueue(%q): marshalling the request: %w", fullMethod, err)
	}
	id := newID()
	if _, err := tx.Exec(ctx, o.sql.insert, id, fullMethod, payload); err != nil {
		return "", fmt.Errorf("outbox: Enqueue(%q): %w", fullMethod, err)
	}
	return id, nil
}

// newID returns 128 random bits in base64url.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// lookupMethod returns the descriptor of the unary method fullMethod from
// the protobuf registry.
func lookupMethod(fullMethod string) (protoreflect.MethodDescriptor, error) {
	svc, m, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !strings.HasPrefix(fullMethod, "/") || !ok || svc == "" || m == "" || strings.Contains(m, "/") {
		return nil, fmt.Errorf("outbox: %q is not a full method: want \"/package.Service/Method\"", fullMethod)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("outbox: %q: the service %s is not in the protobuf registry (link its generated code in): %w", fullMethod, svc, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("outbox: %q: %s is not a service", fullMethod, svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(m))
	switch {
	case md == nil:
		return nil, fmt.Errorf("outbox: %q: the service %s has no method %s", fullMethod, svc, m)
	case md.IsStreamingClient() || md.IsStreamingServer():
		return nil, fmt.Errorf("outbox: %q: a streaming method; the outbox delivers unary requests", fullMethod)
	}
	return md, nil
}
