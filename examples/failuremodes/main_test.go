package failuremodes_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(stopPostgres{m},
		// toxiproxy (the network-fault tests' proxy) may leave a link's
		// goroutines behind after the proxy stopped: toxics blocked on a
		// channel send once the link's writer ended, and now and then a
		// reader of a connection it failed to close. Its own leaks, on
		// connections the tests have finished with, not ours.
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).write"),
	)
}

// stopPostgres runs the tests, then stops the PostgreSQL cluster they
// shared (pgtest.DSN), before goleak looks for goroutines left running.
type stopPostgres struct{ m *testing.M }

func (s stopPostgres) Run() int {
	defer pgtest.StopShared()
	return s.m.Run()
}
