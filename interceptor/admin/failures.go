package admin

import (
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	rescodes "github.com/grpc-resilience/resilience/codes"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// failure is one failed attempt the view heard of. Its message is read
// from err when shown, not when heard of, so the failure path formats
// nothing.
type failure struct {
	time time.Time
	code codes.Code
	err  error
}

func (f failure) message() string { return cut(errText(f.err)) }

func (f failure) proto() *adminv1.Failure {
	return &adminv1.Failure{Time: timestamppb.New(f.time), Code: rescodes.Name(f.code), Message: f.message()}
}

// failuresPerMethod is how many failures a method keeps; maxFailMethods
// bounds the methods kept (a Client's methods are bounded by its own
// bound, but the view does not rely on it).
const (
	failuresPerMethod = maxFailures
	maxFailMethods    = 1024
)

// failRing is one method's last failures.
type failRing struct {
	buf   [failuresPerMethod]failure
	start int
	n     int
}

// failures are the recent failed attempts of a Client's methods, fed by
// its retry and stop hooks (failure paths only).
type failures struct {
	mu sync.Mutex
	m  map[string]*failRing // by full method; at most maxFailMethods
}

func newFailures() *failures { return &failures{m: map[string]*failRing{}} }

// add records a failure of fullMethod; a method beyond the bound is not
// kept.
func (fs *failures) add(fullMethod string, f failure) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	r := fs.m[fullMethod]
	if r == nil {
		if len(fs.m) >= maxFailMethods {
			return
		}
		r = &failRing{}
		fs.m[fullMethod] = r
	}
	i := (r.start + r.n) % failuresPerMethod
	if r.n == failuresPerMethod {
		r.start = (r.start + 1) % failuresPerMethod
	} else {
		r.n++
	}
	r.buf[i] = f
}

// recent returns fullMethod's failures, oldest first.
func (fs *failures) recent(fullMethod string) []failure {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	r := fs.m[fullMethod]
	if r == nil {
		return nil
	}
	out := make([]failure, r.n)
	for i := range r.n {
		out[i] = r.buf[(r.start+i)%failuresPerMethod]
	}
	return out
}

// methods returns the methods with failures kept, sorted.
func (fs *failures) methods() []string {
	fs.mu.Lock()
	out := make([]string, 0, len(fs.m))
	for m := range fs.m {
		out = append(out, m)
	}
	fs.mu.Unlock()
	slices.Sort(out)
	return out
}
