package examples_test

import (
	"os"
	"testing"
)

// buildDirs are directories of binaries built once for several tests,
// removed when the tests end.
var buildDirs []string

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range buildDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}
