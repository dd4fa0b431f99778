package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// echoServer is the echo service. Each execution of a unary handler for a
// call with an idempotency key is appended to the execution log (when
// set) before the reply, so a test can count executions per key across a
// SIGKILL.
//
// It is not resiliencetest.Server, though the stream handlers are the same
// echo loops: that fake records every attempt with a copy of its metadata
// (memory that grows with every call of a long-running process) and
// imports package testing; this is a real server.
type echoServer struct {
	echov1.UnimplementedEchoServiceServer

	mu  sync.Mutex // serializes writes to log, one line per write
	log *os.File   // nil when there is no execution log

	// forward, when set (-forward), answers Echo and Lookup: the backends'
	// answer, or their error, is the call's.
	forward echov1.EchoServiceClient
}

func newEcho(path string) (*echoServer, error) {
	if path == "" {
		return &echoServer{}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("-execution-log: %w", err)
	}
	return &echoServer{log: f}, nil
}

func (e *echoServer) close() {
	if e.log != nil {
		e.log.Close()
	}
}

// logExecution appends "<idempotency-key> <method> <message>\n" for a keyed
// call, newlines in the message escaped as \n. A failed write fails the
// call: the test that reads the log must not miss an execution.
func (e *echoServer) logExecution(ctx context.Context, msg string) error {
	if e.log == nil {
		return nil
	}
	keys := metadata.ValueFromIncomingContext(ctx, wire.IdempotencyKeyHeader)
	if len(keys) == 0 {
		return nil
	}
	method, _ := grpc.Method(ctx)
	line := keys[0] + " " + method + " " + strings.ReplaceAll(msg, "\n", `\n`) + "\n"
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.log.WriteString(line); err != nil {
		return status.Errorf(codes.Internal, "execution log: %v", err)
	}
	return nil
}

func (e *echoServer) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	if err := e.logExecution(ctx, req.GetMessage()); err != nil {
		return nil, err
	}
	if e.forward != nil {
		return e.forward.Echo(ctx, req)
	}
	return &echov1.EchoResponse{Message: req.GetMessage(), Payload: req.GetPayload()}, nil
}

func (e *echoServer) Lookup(ctx context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	if err := e.logExecution(ctx, req.GetMessage()); err != nil {
		return nil, err
	}
	if e.forward != nil {
		return e.forward.Lookup(ctx, req)
	}
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

func (e *echoServer) ServerStream(req *echov1.ServerStreamRequest, ss grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	for i := range req.GetCount() {
		if err := ss.Send(&echov1.ServerStreamResponse{Message: req.GetMessage(), Index: i}); err != nil {
			return err
		}
	}
	return nil
}

func (e *echoServer) ClientStream(ss grpc.ClientStreamingServer[echov1.ClientStreamRequest, echov1.ClientStreamResponse]) error {
	var out echov1.ClientStreamResponse
	for {
		req, err := ss.Recv()
		if err == io.EOF {
			return ss.SendAndClose(&out)
		}
		if err != nil {
			return err
		}
		out.Messages = append(out.Messages, req.GetMessage())
	}
}

func (e *echoServer) BidiStream(ss grpc.BidiStreamingServer[echov1.BidiStreamRequest, echov1.BidiStreamResponse]) error {
	for {
		req, err := ss.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ss.Send(&echov1.BidiStreamResponse{Message: req.GetMessage()}); err != nil {
			return err
		}
	}
}
