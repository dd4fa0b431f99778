package serviceconfig

// ParseOption configures Parse.
type ParseOption interface {
	apply(*parseOptions)
}

// parseOptions is what the ParseOptions set; the zero value is not used,
// see defaultParseOptions.
type parseOptions struct {
	// maxAttemptsCap is the largest MaxAttempts a parsed retry or hedging
	// policy keeps; larger values are lowered to it. Always ≥ 2.
	maxAttemptsCap int
}

func defaultParseOptions() parseOptions {
	return parseOptions{maxAttemptsCap: DefaultMaxAttemptsCap}
}

type maxAttemptsCapOption int

var _ ParseOption = maxAttemptsCapOption(0)

func (n maxAttemptsCapOption) apply(o *parseOptions) {
	o.maxAttemptsCap = int(n)
	if n < 2 {
		o.maxAttemptsCap = DefaultMaxAttemptsCap
	}
}

// WithMaxAttemptsCap sets the largest maxAttempts a retry or hedging policy
// keeps: a document asking for more gets n, as grpc.WithMaxCallAttempts(n)
// does in grpc-go. n < 2 means the default, [DefaultMaxAttemptsCap] (5).
//
// Pass the same n to both when a client also uses grpc's own retry, so that
// both read the document alike.
func WithMaxAttemptsCap(n int) ParseOption { return maxAttemptsCapOption(n) }
