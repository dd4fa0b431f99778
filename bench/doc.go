// Package bench compares grpc-resilience with its peers side by side in one
// process. It is a separate module, so the library's go.mod never gains a
// peer dependency.
package bench
