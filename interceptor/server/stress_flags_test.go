package server

import "flag"

// stressFor makes the stress tests run for this long instead of their short
// default: go test -run Stress ./interceptor/server -stress=10m.
var stressFor = flag.Duration("stress", 0, "run the stress tests for this long (0: the short CI size)")

// longMode runs the long versions of the tests that have one, as CI's long
// mode does: go test -run Soak ./interceptor/server -long (the soak for 60 s).
var longMode = flag.Bool("long", false, "run the long versions of the soak (60 s) and similar tests")

// soakFor makes TestSoak run for this long, overriding -long:
// go test -run Soak ./interceptor/server -soak=10m.
var soakFor = flag.Duration("soak", 0, "run the soak test for this long (0: 3 s, or 60 s with -long)")
