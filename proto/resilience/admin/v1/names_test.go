package adminv1

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestLabels pins the names the admin page and cmd/resadmin show, and
// that every value of each enum has one of its own: a value added to the
// proto without a label here fails.
func TestLabels(t *testing.T) {
	tests := []struct {
		name  string
		label func(protoreflect.EnumNumber) string
		enum  protoreflect.EnumDescriptor
		want  map[protoreflect.EnumNumber]string // pinned: UNSPECIFIED, some values, one unknown to the proto
	}{
		{"Part", func(n protoreflect.EnumNumber) string { return Part(n).Label() }, Part(0).Descriptor(),
			map[protoreflect.EnumNumber]string{0: "other", 1: "breaker", 4: "retry budget", 10: "idempotency store", 11: "rate limit", 999: "999"}},
		{"BreakerState", func(n protoreflect.EnumNumber) string { return BreakerState(n).Label() }, BreakerState(0).Descriptor(),
			map[protoreflect.EnumNumber]string{0: "unknown", 1: "closed", 2: "open", 3: "half-open", 4: "forced-open", 5: "forced-closed", 999: "unknown"}},
		{"EventKind", func(n protoreflect.EnumNumber) string { return EventKind(n).Label() }, EventKind(0).Descriptor(),
			map[protoreflect.EnumNumber]string{0: "unknown", 1: "state", 2: "refused", 3: "ejected", 4: "returned", 5: "store failed", 6: "write", 999: "unknown"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for n, want := range tt.want {
				if got := tt.label(n); got != want {
					t.Errorf("%s(%d).Label() = %q, want %q", tt.name, n, got, want)
				}
			}
			seen := map[string]protoreflect.Name{}
			values := tt.enum.Values()
			for i := range values.Len() {
				v := values.Get(i)
				if v.Number() == 0 {
					continue // UNSPECIFIED: pinned above
				}
				label := tt.label(v.Number())
				if label == "" || label == "unknown" || label == "other" {
					t.Errorf("%s.Label() = %q: the value has no label of its own", v.Name(), label)
				}
				if prev, ok := seen[label]; ok {
					t.Errorf("%s.Label() = %q, the label of %s too", v.Name(), label, prev)
				}
				seen[label] = v.Name()
			}
		})
	}
}
