package server

import (
	"net"
	"testing"

	"google.golang.org/grpc"
)

// serveLoopback serves gs on a loopback TCP port and returns its address;
// stop stops gs and waits for Serve to return. (The network-fault tests
// that had it moved to examples/failuremodes, with their own copy.)
func serveLoopback(t *testing.T, gs *grpc.Server) (addr string, stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	return lis.Addr().String(), func() {
		gs.Stop()
		<-served
	}
}
