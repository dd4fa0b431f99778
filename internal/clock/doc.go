// Package clock abstracts time for the engines and the interceptors, so that
// tests can pin every instant.
//
// Engines take now as a parameter wherever they can; a Clock is for the few
// places that must wait (backoff, bulkhead queues) or read the time
// themselves. Real is backed by package time, so tests that run inside a
// testing/synctest bubble get fake time with it too.
package clock
