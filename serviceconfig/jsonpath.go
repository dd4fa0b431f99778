package serviceconfig

import (
	"encoding/json"
	"strings"
)

// pathAt returns the JSON path, such as "methodConfig[0].name", of the
// innermost value of data that holds the byte at offset pos: the value
// encoding/json complained about when it reported an error after reading
// pos+1 bytes. data needs to be valid JSON only up to pos; past an error the
// path is the deepest one reached. Keys are written as in data.
func pathAt(data []byte, pos int64) string {
	s := pathScanner{data: data, pos: int(max(0, min(pos, int64(len(data)))))}
	s.value()
	return s.result
}

// pathScanner walks JSON text until it passes pos, keeping the path of the
// value it is in. It never fails: on anything unexpected it stops where it is.
type pathScanner struct {
	data   []byte
	i      int      // next byte to read
	pos    int      // the byte whose path is wanted
	path   []string // ".key" and "[n]" segments
	done   bool
	result string
}

// stop records the current path as the result.
func (s *pathScanner) stop() {
	if !s.done {
		s.done = true
		s.result = strings.TrimPrefix(strings.Join(s.path, ""), ".")
	}
}

// passed reports, and stops, when the scanner has read past pos or data.
func (s *pathScanner) passed() bool {
	if s.i > s.pos || s.i >= len(s.data) {
		s.stop()
	}
	return s.done
}

func (s *pathScanner) ws() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *pathScanner) value() {
	s.ws()
	if s.passed() {
		return
	}
	switch s.data[s.i] {
	case '{':
		s.object()
	case '[':
		s.array()
	case '"':
		s.str()
		s.passed()
	default:
		s.literal()
		s.passed()
	}
}

// object reads an object, each member under its ".key" segment.
func (s *pathScanner) object() {
	s.members('}', func(int) (string, bool) {
		if s.data[s.i] != '"' {
			return "", false
		}
		start := s.i
		s.str()
		if s.passed() {
			return "", false
		}
		var key string
		if json.Unmarshal(s.data[start:s.i], &key) != nil {
			key = string(s.data[start:s.i])
		}
		s.ws()
		if s.i >= len(s.data) || s.data[s.i] != ':' {
			return "", false
		}
		s.i++
		return "." + key, true
	})
}

// array reads an array, each element under its "[n]" segment.
func (s *pathScanner) array() {
	s.members(']', func(n int) (string, bool) { return "[" + itoa(n) + "]", true })
}

// members reads the members of an object or array up to its closing byte.
// Before each member, segment reads what comes before the member's value
// (an object's key and colon) and returns the member's path segment; false
// stops the scan where it is.
func (s *pathScanner) members(closing byte, segment func(n int) (string, bool)) {
	s.i++ // '{' or '['
	for n := 0; !s.passed(); {
		s.ws()
		if s.passed() {
			return
		}
		switch s.data[s.i] {
		case closing:
			s.i++
			s.passed()
			return
		case ',':
			s.i++
			continue
		}
		seg, ok := segment(n)
		if !ok {
			s.stop()
			return
		}
		s.path = append(s.path, seg)
		s.value()
		s.path = s.path[:len(s.path)-1]
		n++
	}
}

// str reads a string, its quotes included.
func (s *pathScanner) str() {
	s.i++ // '"'
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case '\\':
			s.i += 2
		case '"':
			s.i++
			return
		default:
			s.i++
		}
	}
	s.i = min(s.i, len(s.data))
}

// literal reads a number, true, false or null, or at least one stray byte.
func (s *pathScanner) literal() {
	start := s.i
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ',', ']', '}', ' ', '\t', '\n', '\r', ':', '"', '{', '[':
			if s.i == start {
				s.i++
			}
			return
		}
		s.i++
	}
}
