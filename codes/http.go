package codes

import "google.golang.org/grpc/codes"

// FromHTTPStatus returns the gRPC code for an HTTP response status, following
// gRPC's mapping for responses that carry no grpc-status
// (https://github.com/grpc/grpc/blob/master/doc/http-grpc-status-mapping.md):
//
//	400 INTERNAL             401 UNAUTHENTICATED   403 PERMISSION_DENIED
//	404 UNIMPLEMENTED        429 UNAVAILABLE       502 UNAVAILABLE
//	503 UNAVAILABLE          504 UNAVAILABLE       other UNKNOWN
//
// The one addition is 2xx, which maps to OK: the function is for users
// fronting plain HTTP backends, where a 2xx response is a success. (In gRPC's
// table a 2xx response without grpc-status is malformed and UNKNOWN.)
func FromHTTPStatus(httpStatus int) codes.Code {
	if httpStatus >= 200 && httpStatus < 300 {
		return codes.OK
	}
	switch httpStatus {
	case 400:
		return codes.Internal
	case 401:
		return codes.Unauthenticated
	case 403:
		return codes.PermissionDenied
	case 404:
		return codes.Unimplemented
	case 429, 502, 503, 504:
		return codes.Unavailable
	}
	return codes.Unknown
}
