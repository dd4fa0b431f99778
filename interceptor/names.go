package interceptor

import (
	"log/slog"
	"sync"

	"google.golang.org/grpc/grpclog"

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

// grpcLog is where a Client writes its warnings without WithLogger.
var grpcLog = grpclog.Component("resilience")

// maxWarned bounds the warnings a warnLog remembers having written; past
// it, it forgets them all and starts again, so a resolver delivering ever
// new configs cannot grow it.
const maxWarned = 256

// warnLog writes a Client's warnings, each text once: to its slog.Logger
// (WithLogger), or to grpclog's "resilience" component. A config given
// again (a resolver's that comes back, the client's own restored) does
// not log its warnings again. Safe for concurrent use.
type warnLog struct {
	l    *slog.Logger // nil: grpclog
	mu   sync.Mutex
	seen map[string]struct{} // the texts written; guarded by mu
}

// warn writes msg, unless it was written before.
func (w *warnLog) warn(msg string) {
	w.mu.Lock()
	_, dup := w.seen[msg]
	if !dup {
		if w.seen == nil || len(w.seen) >= maxWarned {
			w.seen = make(map[string]struct{})
		}
		w.seen[msg] = struct{}{}
	}
	w.mu.Unlock()
	switch {
	case dup:
	case w.l != nil:
		w.l.Warn(msg)
	default:
		grpcLog.Warning(msg)
	}
}

// warnAll writes each of msgs, as warn does.
func (w *warnLog) warnAll(msgs []string) {
	for _, m := range msgs {
		w.warn(m)
	}
}
