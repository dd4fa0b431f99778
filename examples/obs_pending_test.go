//go:build !resilience_obs

package examples_test

// obsMerged is false until branch obs (server idempotency metrics and the
// A96 client series) is merged; see obs_merged_test.go.
const obsMerged = false
