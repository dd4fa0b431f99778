package faultinject_test

import (
	"log"
	"testing"
)

// exampleT stands for the *testing.T of a real test in the Examples: it
// runs the cleanups when done is called.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (*exampleT) Helper()                           {}
func (e *exampleT) Cleanup(f func())                { e.cleanups = append(e.cleanups, f) }
func (*exampleT) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }

func (e *exampleT) done() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
