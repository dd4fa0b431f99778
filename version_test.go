package resilience

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// release matches a release heading of CHANGELOG.md: "## v0.4.0 — 2026-12-01".
var release = regexp.MustCompile(`^## (v\d+\.\d+\.\d+) — (\d{4}-\d{2}-\d{2})$`)

// unreleased is the heading of the changes on main since the newest
// release: allowed first, and only first.
const unreleased = "## Unreleased"

// TestVersionIsTheChangelogsNewestRelease: Version names the newest release
// of CHANGELOG.md, so that the version a program prints is one the changelog
// describes; and every release heading is dated, newest first, after at
// most one "## Unreleased" section.
func TestVersionIsTheChangelogsNewestRelease(t *testing.T) {
	data, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	var versions, dates []string
	headings := 0
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "## ") {
			continue
		}
		headings++
		if line == unreleased && headings == 1 { // what main holds beyond the newest release
			continue
		}
		m := release.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("CHANGELOG.md: %q is not a release heading (## vX.Y.Z — YYYY-MM-DD), nor %q first", line, unreleased)
			continue
		}
		versions = append(versions, m[1])
		dates = append(dates, m[2])
	}
	if len(versions) == 0 {
		t.Fatal("CHANGELOG.md has no release heading")
	}
	if versions[0] != Version {
		t.Errorf("Version = %s, CHANGELOG.md's newest release is %s", Version, versions[0])
	}
	for i := 1; i < len(versions); i++ {
		if dates[i] > dates[i-1] {
			t.Errorf("CHANGELOG.md: %s (%s) is listed before %s (%s): newest first", versions[i-1], dates[i-1], versions[i], dates[i])
		}
		if !newer(versions[i-1], versions[i]) {
			t.Errorf("CHANGELOG.md: %s is listed before %s: newest first", versions[i-1], versions[i])
		}
	}
}

// newer reports whether semantic version a is newer than b (both vX.Y.Z).
func newer(a, b string) bool {
	var x, y [3]int
	if _, err := fmt.Sscanf(a, "v%d.%d.%d", &x[0], &x[1], &x[2]); err != nil {
		return false
	}
	if _, err := fmt.Sscanf(b, "v%d.%d.%d", &y[0], &y[1], &y[2]); err != nil {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return x[i] > y[i]
		}
	}
	return false
}
