package deadline_test

import (
	"fmt"
	"time"

	"github.com/grpc-resilience/resilience/deadline"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func ExampleRemaining() {
	d, ok := deadline.Remaining(now.Add(250*time.Millisecond), now)
	fmt.Println(d, ok)
	d, ok = deadline.Remaining(time.Time{}, now)
	fmt.Println(d, ok)
	// Output:
	// 250ms true
	// 0s false
}

func ExampleAttemptTimeout() {
	dl := now.Add(100 * time.Millisecond)
	// A 500 ms per-attempt timeout is cut to what is left, keeping 5 ms.
	timeout, ok := deadline.AttemptTimeout(dl, now, 500*time.Millisecond, 5*time.Millisecond)
	fmt.Println(timeout, ok)
	// 4 ms left and 5 ms of headroom: no attempt may start.
	timeout, ok = deadline.AttemptTimeout(now.Add(4*time.Millisecond), now, 0, 5*time.Millisecond)
	fmt.Println(timeout, ok)
	// Output:
	// 95ms true
	// 0s true
}

func ExampleFit() {
	dl := now.Add(50 * time.Millisecond)
	// 20 ms of backoff, then an attempt that takes about 25 ms: it fits.
	fmt.Println(deadline.Fit(dl, now, 20*time.Millisecond, 25*time.Millisecond, 0))
	// 30 ms would end after the deadline: stop now instead of idling to it.
	v := deadline.Fit(dl, now, 20*time.Millisecond, 30*time.Millisecond+time.Nanosecond, 0)
	fmt.Println(v, v.OK())
	// Output:
	// fits
	// too short false
}

func ExampleHandlerDeadline() {
	incoming := now.Add(80 * time.Millisecond)
	handler, reject := deadline.HandlerDeadline(incoming, now, 10*time.Millisecond, 20*time.Millisecond)
	fmt.Println(handler.Sub(now), reject)
	// Only 15 ms left, below the 20 ms floor: reject with DEADLINE_EXCEEDED.
	_, reject = deadline.HandlerDeadline(now.Add(15*time.Millisecond), now, 10*time.Millisecond, 20*time.Millisecond)
	fmt.Println(reject)
	// Output:
	// 70ms false
	// true
}
