package serviceconfig_test

import (
	"io"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/grpclog"
)

func TestMain(m *testing.M) {
	// grpc-go logs a warning for every document it rejects; the differential
	// tests feed it many on purpose.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))
	goleak.VerifyTestMain(m)
}
