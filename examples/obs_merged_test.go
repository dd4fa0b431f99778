//go:build resilience_obs

package examples_test

// obsMerged: interceptor.WithServerMeterProvider and the A96 client series
// exist (branch obs). MERGE NOTE: once obs is merged, delete
// obs_pending_test.go, this file's build tag and the examples/server
// metrics_noobs.go file, and make obsMerged always true.
const obsMerged = true
