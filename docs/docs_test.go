// Package docs holds no code: it is the directory of the documentation pages
// (docs/*.md), and its tests check that the code those pages and the README
// show compiles, and that no page points a reader at a test function.
package docs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// root is the repository's root, seen from this package's directory.
const root = ".."

// block is one fenced code block of a Markdown file.
type block struct {
	file string // relative to root
	line int    // of the opening fence, 1-based
	lang string // the fence's info string: go, json, sh, ...
	text string
}

func (b block) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// pages lists README.md and every docs/*.md, relative to root.
func pages(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range more {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, rel)
	}
	return files
}

// blocks returns the fenced code blocks of the Markdown file at root/file.
func blocks(t *testing.T, file string) []block {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	var (
		out  []block
		cur  *block
		body strings.Builder
	)
	for i, line := range strings.Split(string(data), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &block{file: file, line: i + 1, lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
			body.Reset()
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.text = body.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	if cur != nil {
		t.Fatalf("%s: a code block is never closed", cur)
	}
	return out
}

// isFile reports whether a Go block is a whole source file (it declares its
// package) rather than a fragment of a function body.
func isFile(src string) bool {
	for _, line := range strings.Split(src, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		return strings.HasPrefix(line, "package ")
	}
	return false
}

// tok is one Go token; automatic and written semicolons compare equal.
type tok struct {
	t   token.Token
	lit string
}

// tokens scans src into tokens, comments left out.
func tokens(src []byte) ([]tok, error) {
	fset := token.NewFileSet()
	f := fset.AddFile("", -1, len(src))
	var s scanner.Scanner
	var errs scanner.ErrorList
	s.Init(f, src, func(pos token.Position, msg string) { errs.Add(pos, msg) }, 0)
	var out []tok
	for {
		_, t, lit := s.Scan()
		if t == token.EOF {
			break
		}
		switch {
		case t == token.SEMICOLON:
			lit = ""
		case t == token.STRING && strings.HasPrefix(lit, "`"):
			lit = dedent(lit)
		}
		out = append(out, tok{t, lit})
	}
	return out, errs.Err()
}

// dedent removes the leading blanks of every line of a raw string, so that a
// block indented less than the Example it is copied from still matches.
func dedent(raw string) string {
	lines := strings.Split(raw, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimLeft(l, " \t")
	}
	return strings.Join(lines, "\n")
}

// contains reports whether want occurs in have as a contiguous run.
func contains(have, want []tok) bool {
	for i := 0; i+len(want) <= len(have); i++ {
		match := true
		for j := range want {
			if have[i+j] != want[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// example is the body of one runnable Example function of the repository.
type example struct {
	name string // package directory and function, as a reader would look it up
	body []tok
}

// examples collects the bodies of every Example function in the repository's
// test files (the library, the examples module and bench).
func examples(t *testing.T) []example {
	t.Helper()
	var out []example
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !bytes.Contains(src, []byte("func Example")) {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Example") || fn.Body == nil {
				continue
			}
			from := fset.Position(fn.Body.Lbrace).Offset + 1
			to := fset.Position(fn.Body.Rbrace).Offset
			body, err := tokens(src[from:to])
			if err != nil {
				return fmt.Errorf("%s: %s: %w", path, fn.Name.Name, err)
			}
			out = append(out, example{name: dir + "." + fn.Name.Name, body: body})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("found no Example function under the repository's root")
	}
	return out
}

// TestGoBlocksCompile checks every ```go block of README.md and docs/*.md:
// a block that declares its package is a whole file, and must compile as a
// package of the module; any other block must be copied, token for token
// (comments aside), from the body of a runnable Example function, which
// `go test` compiles and runs.
func TestGoBlocksCompile(t *testing.T) {
	var files []block
	var exs []example
	for _, page := range pages(t) {
		for _, b := range blocks(t, page) {
			if b.lang != "go" {
				continue
			}
			if isFile(b.text) {
				files = append(files, b)
				continue
			}
			if exs == nil {
				exs = examples(t)
			}
			want, err := tokens([]byte(b.text))
			if err != nil {
				t.Errorf("%s: the block does not scan as Go: %v", b, err)
				continue
			}
			found := false
			for _, ex := range exs {
				if contains(ex.body, want) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s: the Go fragment is in no Example function's body: copy it from one, token for token, "+
					"or make the block a whole file (package clause and imports)", b)
			}
		}
	}
	if len(files) > 0 {
		buildFiles(t, files)
	}
}

// buildFiles compiles each whole-file block as a package of its own inside
// the module, through an overlay: nothing is written into the source tree.
func buildFiles(t *testing.T, files []block) {
	t.Helper()
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	where := map[string]block{}
	for i, b := range files {
		src := filepath.Join(tmp, fmt.Sprintf("block%03d.go", i))
		if err := os.WriteFile(src, []byte(b.text), 0o644); err != nil {
			t.Fatal(err)
		}
		dir := fmt.Sprintf("_doccheck/block%03d", i)
		overlay[filepath.Join(abs, dir, "main.go")] = src
		pkgs = append(pkgs, "./"+dir)
		where[src] = b
	}
	data, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlayFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// -o into the temporary directory: go build writes a lone main
	// package's executable into the working directory otherwise.
	args := append([]string{"build", "-overlay", overlayFile, "-o", tmp + string(filepath.Separator)}, pkgs...)
	cmd := exec.Command(goTool(t), args...)
	cmd.Dir = abs
	out, err := cmd.CombinedOutput()
	if err != nil {
		// Name each failing block by its page and line, not by the overlay's path.
		msg := string(out)
		for src, b := range where {
			msg = strings.ReplaceAll(msg, src, b.String()+", the block's line")
		}
		t.Errorf("whole-file Go blocks do not compile (go %s): %v\n%s", strings.Join(args[:2], " "), err, msg)
	}
}

// goTool is the go command of the toolchain running the test.
func goTool(t *testing.T) string {
	t.Helper()
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command to compile the docs' whole-file blocks: %v", err)
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestJSONBlocksAreJSON checks that every ```json block of README.md and
// docs/*.md is a well-formed JSON document (what each means is checked where
// it matters: CI runs `svcconfig check -strict` on README's first one).
func TestJSONBlocksAreJSON(t *testing.T) {
	for _, page := range pages(t) {
		for _, b := range blocks(t, page) {
			if b.lang == "json" && !json.Valid([]byte(b.text)) {
				t.Errorf("%s: the json block is not valid JSON", b)
			}
		}
	}
}

var (
	// testName matches a test function's name.
	testName = regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9_]*`)
	// runFlag matches a go test command's -run flag and its pattern.
	runFlag = regexp.MustCompile(`-run[= ]('[^']*'|"[^"]*"|[^ \x60]*)`)
)

// TestNoPageNamesATestFunction: documentation shows runnable Examples and
// prose, never a test function (which go doc does not show); a Markdown code
// block may show a test for the reader to write. It covers
// README.md, docs/*.md and the package documentation (doc.go) of every
// public package; TestMain, a function Go itself defines, may be named, and
// so may the tests of storetest, a conformance suite whose API is tests.
func TestNoPageNamesATestFunction(t *testing.T) {
	check := func(file string) {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		inCode := false // a Markdown code block may show a test of the reader's own
		for i, line := range strings.Split(string(data), "\n") {
			if strings.HasSuffix(file, ".md") && strings.HasPrefix(strings.TrimSpace(line), "```") {
				inCode = !inCode
				continue
			}
			if inCode {
				continue
			}
			// A go test command's -run pattern selects tests: it does not
			// send the reader to read one.
			line = runFlag.ReplaceAllString(line, "")
			for _, name := range testName.FindAllString(line, -1) {
				if name == "TestMain" {
					continue
				}
				t.Errorf("%s:%d: names the test function %s: show an Example, or say in prose what it shows", file, i+1, name)
			}
		}
	}
	for _, page := range pages(t) {
		check(page)
	}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "internal" || name == "testdata" || name == "storetest" || name == "bench") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() == "doc.go" {
			check(rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestQuickStartIsExamplesQuickstart: the README's quick start is the
// program examples/quickstart, character for character, so that the
// command the README gives runs the code it shows.
func TestQuickStartIsExamplesQuickstart(t *testing.T) {
	const program = "examples/quickstart/main.go"
	want, err := os.ReadFile(filepath.Join(root, program))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks(t, "README.md") {
		if b.lang == "go" {
			if b.text != string(want) {
				t.Errorf("%s: README's first Go block (the quick start) is not %s as it is: copy the file into it", b, program)
			}
			return
		}
	}
	t.Errorf("README.md has no Go block: its quick start is %s", program)
}

// link matches a Markdown link's target: [text](target).
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// slug is the anchor GitHub gives a heading: lower case, punctuation other
// than hyphens and underscores dropped, spaces made hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 0x7f && r != '—' && r != '–' && r != '→':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of the headings of the Markdown file at path.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if !inCode && strings.HasPrefix(line, "#") {
			out[slug(strings.TrimSpace(strings.TrimLeft(line, "#")))] = true
		}
	}
	return out
}

// TestLinksResolve: every relative link of README.md and docs/*.md names a
// file of the repository, and every #anchor a heading of its page.
func TestLinksResolve(t *testing.T) {
	for _, page := range pages(t) {
		data, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := filepath.Join(root, page) // a bare #anchor is on the page itself
			if file != "" {
				path = filepath.Join(root, filepath.Dir(page), file)
				if !fileExists(path) {
					t.Errorf("%s: the link %s names no file (%s)", page, target, path)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[anchor] {
				t.Errorf("%s: the link %s names no heading of %s", page, target, path)
			}
		}
	}
}
