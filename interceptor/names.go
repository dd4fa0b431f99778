package interceptor

import (
	"hash/maphash"
	"log/slog"
	"sync"

	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
)

// Names in options and methods. A name that no well-formed call carries (a
// service with a slash, a method without its leading slash, a stray space)
// would otherwise leave its option without effect and say nothing: every
// option and method that takes a name checks its form and quotes it. A
// name whose form is right but that names nothing linked into the program
// is checked against the registry of generated code (see confcheck.go).

// registered, streamKind and streamMethods read the registry of the program's generated
// code: see rpcname.Registered and rpcname.StreamKind.
var (
	registered    = rpcname.Registered
	streamKind    = rpcname.StreamKind
	streamMethods = rpcname.StreamMethods
)

// maxWarned bounds the warnings a warnLog remembers having written; past
// it, it forgets them all and starts again, so a resolver delivering ever
// new configs cannot grow it. It remembers a hash of each text, not the
// text, whose length the caller chooses (a name given to Status, a key of
// a resolver's document): its memory is bounded in bytes too.
const maxWarned = 256

// warnLog writes a Client's warnings, each text once: to its slog.Logger
// (WithLogger), or to slog.Default(), read at each warning so that a
// program's slog.SetDefault applies whenever it runs. Not to grpclog: its
// default logger discards warnings (it writes errors only, unless
// GRPC_GO_LOG_SEVERITY_LEVEL asks for more), so a program that set no
// logger would never see a resolver's typo widening a policy. A config
// given again (a resolver's that comes back, the client's own restored)
// does not log its warnings again. Safe for concurrent use.
type warnLog struct {
	l    *slog.Logger // nil: slog.Default()
	mu   sync.Mutex
	seed maphash.Seed        // of the hashes in seen; set with seen
	seen map[uint64]struct{} // the hashes of the texts written; guarded by mu
}

// warn writes msg, unless it was written before.
func (w *warnLog) warn(msg string) {
	w.mu.Lock()
	if w.seen == nil {
		w.seed, w.seen = maphash.MakeSeed(), make(map[uint64]struct{})
	}
	h := maphash.String(w.seed, msg)
	_, dup := w.seen[h]
	if !dup {
		if len(w.seen) >= maxWarned {
			clear(w.seen)
		}
		w.seen[h] = struct{}{}
	}
	w.mu.Unlock()
	switch {
	case dup:
	case w.l != nil:
		w.l.Warn(msg)
	default:
		slog.Warn(msg)
	}
}

// warnAll writes each of msgs, as warn does.
func (w *warnLog) warnAll(msgs []string) {
	for _, m := range msgs {
		w.warn(m)
	}
}
