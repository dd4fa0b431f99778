package server

import (
	"fmt"
	"sync"
	"testing"
)

// A caller that invents method names (a server whose UnknownServiceHandler
// runs the interceptors) cannot grow the metrics' attribute sets past
// maxMetricMethods: the rest share the sets built for "other".
func TestMetricMethodSetsAreBounded(t *testing.T) {
	var built []string
	var mu sync.Mutex
	s := methodSets[string]{build: func(m string) *string {
		mu.Lock()
		built = append(built, m)
		mu.Unlock()
		return &m
	}}
	first := s.get("/svc/M0")
	for i := range maxMetricMethods + 100 {
		s.get(fmt.Sprintf("/svc/M%d", i))
	}
	if got := s.get("/svc/M0"); got != first {
		t.Errorf("get(/svc/M0) built anew: %p, want %p", got, first)
	}
	if got := *s.get("/invented/name"); got != "other" {
		t.Errorf("get of a method past the bound = %q, want \"other\"", got)
	}
	if n := len(*s.methods.Load()); n != maxMetricMethods {
		t.Errorf("%d methods kept, want %d", n, maxMetricMethods)
	}
	if want := maxMetricMethods + 1; len(built) != want {
		t.Errorf("build ran %d times, want %d (each kept method once, and \"other\" once)", len(built), want)
	}
}
