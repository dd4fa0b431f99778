package server

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(stopPostgres{m})
}

// stopPostgres runs the tests, then stops the PostgreSQL cluster they
// shared (pgtest.DSN), before goleak looks for goroutines left running.
type stopPostgres struct{ m *testing.M }

func (s stopPostgres) Run() int {
	defer pgtest.StopShared()
	return s.m.Run()
}
