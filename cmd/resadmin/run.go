package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// The exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

const usage = `usage: resadmin [flags] [view]
       resadmin [flags] events [-after SEQUENCE] [-n N]
       resadmin [flags] watch [-after SEQUENCE]
       resadmin [flags] breaker force-open|force-closed|reset CLIENT METHOD

Reads the admin view of a process that uses grpc-resilience
(resilience.admin.v1.AdminService): which part refuses calls and why.

commands:
  view     what is refusing calls now, then every part and the latest
           events (the default)
  events   the recent events, oldest first
  watch    the events as they happen, until interrupted
  breaker  force a Client method's breaker open or closed, or reset it
           (refused unless the process allows writes)

flags (before or after the command):
  -addr HOST:PORT  the process's gRPC address (default 127.0.0.1:50051)
  -json            print protojson, for scripts (watch: one event a line)
  -H KEY:VALUE     metadata to send with each call (repeatable)
  -tls-ca FILE     use TLS, trusting the CA certificates in FILE
  -timeout D       bound of each call but watch (default 10s)
  -after SEQUENCE  events: only the events after this one; watch: first
                   the events kept after this one (0: all), then the new
  -n N             events: only the newest N

exit status: 0 ok; 1 the call failed; 2 usage error.
`

// flags are the parsed command line.
type flags struct {
	addr, tlsCA string
	json        bool
	md          []string
	timeout     time.Duration
	after       *uint64 // nil: -after not given
	n           uint
}

func (f *flags) set(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "addr", "127.0.0.1:50051", "")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "")
	fs.BoolVar(&f.json, "json", false, "")
	fs.Func("H", "", func(s string) error {
		k, v, ok := strings.Cut(s, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return fmt.Errorf("%q: want KEY:VALUE", s)
		}
		f.md = append(f.md, strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v))
		return nil
	})
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "")
	fs.Func("after", "", func(s string) error {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return fmt.Errorf("-after %q: want a sequence number", s)
		}
		f.after = &n
		return nil
	})
	fs.UintVar(&f.n, "n", 0, "")
}

// parse reads args: flags, the command, and flags and arguments after it.
func parse(args []string) (f *flags, cmd string, rest []string, err error) {
	f = &flags{}
	fs := flag.NewFlagSet("resadmin", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.set(fs)
	if err := fs.Parse(args); err != nil {
		return nil, "", nil, err
	}
	cmd = "view"
	if fs.NArg() > 0 {
		cmd = fs.Arg(0)
		// Flags may follow the command, mixed with its arguments.
		var pos []string
		left := fs.Args()[1:]
		for len(left) > 0 {
			if err := fs.Parse(left); err != nil {
				return nil, "", nil, err
			}
			if fs.NArg() == 0 {
				break
			}
			pos = append(pos, fs.Arg(0))
			left = fs.Args()[1:]
		}
		rest = pos
	}
	if f.timeout <= 0 {
		return nil, "", nil, errors.New("-timeout must be positive")
	}
	return f, cmd, rest, nil
}

// run is the command: it parses args (without the program name), runs the
// command and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || a == "help" {
			fmt.Fprint(stdout, usage)
			return exitOK
		}
	}
	f, cmd, rest, err := parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "resadmin: %v\n\n%s", err, usage)
		return exitUsage
	}
	want := map[string]int{"view": 0, "events": 0, "watch": 0, "breaker": 3}
	n, ok := want[cmd]
	if !ok {
		fmt.Fprintf(stderr, "resadmin: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	if len(rest) != n {
		fmt.Fprintf(stderr, "resadmin %s: want %d arguments, got %q\n\n%s", cmd, n, rest, usage)
		return exitUsage
	}
	var action adminv1.BreakerAction
	if cmd == "breaker" {
		if action = breakerAction(rest[0]); action == adminv1.BreakerAction_BREAKER_ACTION_UNSPECIFIED {
			fmt.Fprintf(stderr, "resadmin breaker: action %q: want force-open, force-closed or reset\n", rest[0])
			return exitUsage
		}
	}
	conn, err := dial(f)
	if err != nil {
		fmt.Fprintf(stderr, "resadmin: %v\n", err)
		return exitFailed
	}
	defer conn.Close()
	c := adminv1.NewAdminServiceClient(conn)
	if len(f.md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, f.md...)
	}
	switch cmd {
	case "view":
		err = view(ctx, c, f, stdout)
	case "events":
		err = events(ctx, c, f, stdout)
	case "watch":
		err = watch(ctx, c, f, stdout)
	case "breaker":
		err = breaker(ctx, c, f, action, rest[1], rest[2], stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "resadmin %s: %v\n", cmd, describe(err))
		return exitFailed
	}
	return exitOK
}

// describe is a call's error as an operator reads it.
func describe(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	return err.Error()
}

func breakerAction(s string) adminv1.BreakerAction {
	switch s {
	case "force-open":
		return adminv1.BreakerAction_BREAKER_ACTION_FORCE_OPEN
	case "force-closed":
		return adminv1.BreakerAction_BREAKER_ACTION_FORCE_CLOSED
	case "reset":
		return adminv1.BreakerAction_BREAKER_ACTION_RESET
	}
	return adminv1.BreakerAction_BREAKER_ACTION_UNSPECIFIED
}

func dial(f *flags) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if f.tlsCA != "" {
		pem, err := os.ReadFile(f.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-tls-ca %s: no PEM certificate in it", f.tlsCA)
		}
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	}
	return grpc.NewClient(f.addr, grpc.WithTransportCredentials(creds))
}

var (
	jsonOne    = protojson.MarshalOptions{}
	jsonIndent = protojson.MarshalOptions{Multiline: true, Indent: "  "}
)

func printJSON(w io.Writer, m proto.Message, indent bool) error {
	opts := jsonOne
	if indent {
		opts = jsonIndent
	}
	b, err := opts.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func view(ctx context.Context, c adminv1.AdminServiceClient, f *flags, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	r, err := c.GetView(ctx, &adminv1.GetViewRequest{})
	if err != nil {
		return err
	}
	if f.json {
		return printJSON(w, r.GetView(), true)
	}
	ev, err := c.ListEvents(ctx, &adminv1.ListEventsRequest{MaxEvents: viewEvents})
	if err != nil {
		return err
	}
	return printView(w, r.GetView(), ev.GetEvents())
}

// viewEvents is how many of the newest events view prints.
const viewEvents = 10

func events(ctx context.Context, c adminv1.AdminServiceClient, f *flags, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	var after uint64
	if f.after != nil {
		after = *f.after
	}
	r, err := c.ListEvents(ctx, &adminv1.ListEventsRequest{AfterSequence: after, MaxEvents: uint32(min(f.n, 1<<31))})
	if err != nil {
		return err
	}
	if f.json {
		return printJSON(w, r, true)
	}
	return printEvents(w, r.GetEvents(), r.GetDropped())
}

// watch prints the events as they come until ctx ends (an interrupt),
// which is no error.
func watch(ctx context.Context, c adminv1.AdminServiceClient, f *flags, w io.Writer) error {
	stream, err := c.WatchEvents(ctx, &adminv1.WatchEventsRequest{AfterSequence: f.after})
	if err != nil {
		return err
	}
	if !f.json {
		fmt.Fprintf(w, "watching %s (interrupt to stop)\n", f.addr)
	}
	for {
		r, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if f.json {
			err = printJSON(w, r.GetEvent(), false)
		} else {
			_, err = fmt.Fprintln(w, eventLine(r.GetEvent()))
		}
		if err != nil {
			return err
		}
	}
}

func breaker(ctx context.Context, c adminv1.AdminServiceClient, f *flags, action adminv1.BreakerAction, client, method string, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	r, err := c.ControlBreaker(ctx, &adminv1.ControlBreakerRequest{Client: client, FullMethod: method, Action: action})
	if err != nil {
		return err
	}
	if f.json {
		return printJSON(w, r, true)
	}
	_, err = fmt.Fprintf(w, "client %s %s: breaker %s\n", client, method, r.GetBreaker().GetState().Label())
	return err
}
