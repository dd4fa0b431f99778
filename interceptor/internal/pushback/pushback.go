// Package pushback reads and names a server's retry hint, as the client's
// retries read it and the server's tests check it: gRFC A6's
// grpc-retry-pushback-ms trailer, or a google.rpc.RetryInfo status detail.
package pushback

import (
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Key is gRFC A6's trailer with which a server tells a client how long to
// wait before its next attempt, in milliseconds; a negative value means do
// not retry.
const Key = "grpc-retry-pushback-ms"

// Hint reads a server's retry hint: the grpc-retry-pushback-ms trailer
// (gRFC A6), or else a google.rpc.RetryInfo status detail. refuse is true
// when the server said not to retry: a negative, malformed or repeated value.
func Hint(err error, trailer metadata.MD) (d time.Duration, ok, refuse bool) {
	if vals := trailer[Key]; len(vals) > 0 {
		if len(vals) > 1 {
			return 0, false, true
		}
		ms, perr := strconv.ParseInt(vals[0], 10, 64)
		if perr != nil || ms < 0 {
			return 0, false, true
		}
		if ms > int64(time.Duration(1<<63-1)/time.Millisecond) {
			return time.Duration(1<<63 - 1), true, false
		}
		return time.Duration(ms) * time.Millisecond, true, false
	}
	if _, isStatus := err.(interface{ GRPCStatus() *status.Status }); !isStatus {
		return 0, false, false
	}
	st := status.Convert(err)
	if len(st.Proto().GetDetails()) == 0 {
		return 0, false, false
	}
	found := 0
	for _, det := range st.Details() {
		ri, isRI := det.(*errdetails.RetryInfo)
		if !isRI || ri.GetRetryDelay() == nil {
			continue
		}
		found++
		dd := ri.GetRetryDelay()
		if dd.CheckValid() != nil || dd.AsDuration() < 0 {
			return 0, false, true
		}
		d = dd.AsDuration()
	}
	switch found {
	case 0:
		return 0, false, false
	case 1:
		return d, true, false
	}
	return 0, false, true
}
