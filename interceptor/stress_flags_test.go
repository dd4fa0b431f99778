package interceptor

import "flag"

// stressFor makes the stress tests run for this long instead of their short
// default: go test -run Stress ./interceptor -stress=10m.
var stressFor = flag.Duration("stress", 0, "run the stress tests for this long (0: the short CI size)")
