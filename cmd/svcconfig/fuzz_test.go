package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// FuzzRun feeds documents to check, explain and server, with and without
// -lenient: whatever the document, the
// command exits 0 or 1 and never panics. The seeds are the documents of
// testdata.
func FuzzRun(f *testing.F) {
	files, err := filepath.Glob("testdata/*.json")
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, "/shop.Orders/Create", 0)
	}
	f.Add([]byte(`{"methodConfig":[{"name":[{"service":"a"}],"retryPolicy":{"maxAttempts":1000000,"initialBackoff":"315576000000s","maxBackoff":"315576000000s","backoffMultiplier":1e300,"retryableStatusCodes":[14]}}]}`),
		"/a/B", 1000000000)
	f.Fuzz(func(t *testing.T, doc []byte, method string, maxAttemptsCap int) {
		if _, err := fullMethod(method); err != nil {
			method = "/a.B/C"
		}
		limit := strconv.Itoa(maxAttemptsCap)
		for _, args := range [][]string{
			{"check", "-max-attempts-cap", limit, "--", "-"},
			{"check", "-lenient", "-max-attempts-cap", limit, "--", "-"},
			{"explain", "-attempt-time", "1s", "-max-attempts-cap", limit, "--", "-", method},
			{"explain", "-lenient", "--", "-", method},
			{"server", "--", "-", method},
		} {
			var stdout, stderr bytes.Buffer
			if code := run(args, bytes.NewReader(doc), &stdout, &stderr); code != exitOK && code != exitInvalid {
				t.Errorf("run(%q) on %q = %d, want 0 or 1; stderr:\n%s", args, doc, code, stderr.String())
			}
		}
	})
}
