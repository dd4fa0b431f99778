package faultinject

import (
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
)

// Metadata keys of per-call faults, honoured only with [WithMetadataFaults].
// When any of them is present on a call, the call's faults come from them
// alone and the configuration does not apply to it.
const (
	// MetadataAbort aborts the call with this code, a name such as
	// "UNAVAILABLE" or a number.
	MetadataAbort = "x-fault-abort"
	// MetadataAbortPercentage is the percentage (0 to 100) of such calls
	// aborted; absent means 100. It is drawn from the seeded generator.
	MetadataAbortPercentage = "x-fault-abort-percentage"
	// MetadataPushbackMs adds grpc-retry-pushback-ms with this value to the
	// abort.
	MetadataPushbackMs = "x-fault-pushback-ms"
	// MetadataRetryDelayMs adds a google.rpc.RetryInfo with this delay to
	// the abort.
	MetadataRetryDelayMs = "x-fault-retry-delay-ms"
	// MetadataDelayMs delays the call this many milliseconds.
	MetadataDelayMs = "x-fault-delay-ms"
	// MetadataStreamAbortAfter fails the stream after this many messages,
	// with the code of MetadataStreamAbortCode (UNAVAILABLE when absent).
	MetadataStreamAbortAfter = "x-fault-stream-abort-after"
	// MetadataStreamAbortCode is the code of MetadataStreamAbortAfter.
	MetadataStreamAbortCode = "x-fault-stream-abort-code"
)

// maxMetadataDelay bounds a delay asked for by metadata.
const maxMetadataDelay = time.Hour

// planFromMetadata reads a per-call fault. ok is false when the call asks
// for none; a malformed value is an INVALID_ARGUMENT error naming the key.
func planFromMetadata(md metadata.MD) (p plan, ok bool, err error) {
	get := func(key string) (string, bool) {
		if v := md.Get(key); len(v) > 0 {
			ok = true
			return v[len(v)-1], true
		}
		return "", false
	}
	num := func(key string, lo, hi int64) (int64, bool, error) {
		v, present := get(key)
		if !present {
			return 0, false, nil
		}
		n, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil || n < lo || n > hi {
			return 0, true, status.Errorf(codes.InvalidArgument, "faultinject: metadata %s: %q is not an integer from %d to %d", key, v, lo, hi)
		}
		return n, true, nil
	}
	ms := func(key string, lo, hi int64) (time.Duration, bool, error) {
		n, present, err := num(key, lo, hi)
		return time.Duration(n) * time.Millisecond, present, err
	}
	code := func(key string) (codes.Code, bool, error) {
		v, present := get(key)
		if !present {
			return 0, false, nil
		}
		c, perr := rescodes.Parse(v)
		if perr != nil || c == codes.OK {
			return 0, true, status.Errorf(codes.InvalidArgument, "faultinject: metadata %s: %q is not a failure code", key, v)
		}
		return c, true, nil
	}
	maxMs := maxMetadataDelay.Milliseconds()
	if p.delay, _, err = ms(MetadataDelayMs, 0, maxMs); err != nil {
		return plan{}, true, err
	}
	var a Abort
	var hasAbort bool
	if a.Code, hasAbort, err = code(MetadataAbort); err != nil {
		return plan{}, true, err
	}
	pct, hasPct, err := num(MetadataAbortPercentage, 0, 100)
	if err != nil {
		return plan{}, true, err
	}
	if a.Pushback, _, err = ms(MetadataPushbackMs, -1, maxMs); err != nil {
		return plan{}, true, err
	}
	if a.RetryDelay, _, err = ms(MetadataRetryDelayMs, 0, maxMs); err != nil {
		return plan{}, true, err
	}
	if hasAbort {
		if hasPct {
			a.Rate = float64(pct) / 100
			if a.Rate == 0 {
				hasAbort = false
			}
		}
		if hasAbort {
			p.abort = &a
		}
	}
	after, hasAfter, err := num(MetadataStreamAbortAfter, 1, 1<<31-1)
	if err != nil {
		return plan{}, true, err
	}
	if hasAfter {
		sa := StreamAbort{AfterMessages: int(after), Code: codes.Unavailable}
		if c, has, cerr := code(MetadataStreamAbortCode); cerr != nil {
			return plan{}, true, cerr
		} else if has {
			sa.Code = c
		}
		p.streamAbort = &sa
	}
	return p, ok, nil
}
