package resilience

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pastRelease matches a doc's reference to a release as a point in the
// past: "before v0.5.0", "since v0.4.2".
var pastRelease = regexp.MustCompile(`\b(?:before|since|until|from|in) (v\d+\.\d+\.\d+)\b`)

// TestDocsNameReleasedVersions pins that a doc that dates a behaviour by a
// release ("before v0.5.0 the only one") names a release CHANGELOG.md
// describes, whose section then says what changed. docs/endpoints.md says
// endpointConcurrency 1 was "before v0.5.0 the only one", while
// CHANGELOG.md's newest release is v0.4.3 and no section mentions
// endpointConcurrency, nor that peak_ewma's default cost changed.
func TestDocsNameReleasedVersions(t *testing.T) {
	data, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	var released []string
	for _, line := range strings.Split(string(data), "\n") {
		if m := release.FindStringSubmatch(line); m != nil {
			released = append(released, m[1])
		}
	}
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range append(docs, "README.md") {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		// Markdown wraps lines: read the text as one paragraph.
		flat := strings.Join(strings.Fields(string(text)), " ")
		for _, m := range pastRelease.FindAllStringSubmatch(flat, -1) {
			if !slices.Contains(released, m[1]) {
				t.Errorf("%s: %q names %s, which CHANGELOG.md does not describe (its releases: %s, newest first)",
					doc, m[0], m[1], strings.Join(released[:min(3, len(released))], ", "))
			}
		}
	}
	if !strings.Contains(string(data), "endpointConcurrency") {
		t.Errorf("CHANGELOG.md does not mention endpointConcurrency: peak_ewma's default cost changed from " +
			"latency × (outstanding + 1) to latency × (1 + outstanding / 4) with no entry")
	}
}
