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
	// lenient accepts, as warnings of kind WarningCoverage, the problems
	// that change which methods a policy covers (see Lenient).
	lenient bool
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

type lenientOption struct{}

func (lenientOption) apply(o *parseOptions) { o.lenient = true }

// Lenient makes Parse give grpc-go's verdict on a document whose typo or
// empty entry changes which methods a policy covers, where by default
// Parse refuses it: an unknown key in a name ({"services": "shop.Orders"}
// is the name {}, the default entry, to grpc-go), a key that most likely
// misspells "name" in an entry or "methodConfig" at the top level, an
// unknown top-level key in a document without methodConfig, an entry
// whose name is absent, null or empty (it applies to no method), null in a
// name ({"service": null} is the default entry to grpc-go), and a key
// given twice in a name, or "name" twice in an entry, or "methodConfig"
// twice (grpc-go merges the copies). With
// Lenient they are accepted as grpc-go accepts them and reported by
// [Config.Warnings] as warnings of kind [WarningCoverage].
//
// Use it where grpc-go applies the document anyway, as
// interceptor.Client.WrapResolver does for the configs a resolver
// delivers, so that both read it alike; a program handing its own
// document to a client wants the default, which refuses it.
func Lenient() ParseOption { return lenientOption{} }
