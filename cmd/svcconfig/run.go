package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The exit statuses.
const (
	exitOK      = 0 // valid; with warnings only without -strict
	exitInvalid = 1 // invalid or unreadable document, warnings under -strict, coverage warnings
	exitUsage   = 2 // bad command line
)

const usage = `usage: svcconfig check [flags] FILE
       svcconfig explain [flags] FILE /package.Service/Method
       svcconfig server FILE [/package.Service/Method]

Checks a gRPC service config (gRFC A6 and grpc-resilience's extension blocks)
and explains what the grpc-resilience client does with it.
FILE is a path, or - for standard input.

commands:
  check    validate FILE: print ok and one line per methodConfig entry,
           or the first error, as serviceconfig.Parse words it
  explain  show the entry that applies to the method, its policy with the
           defaults filled in, its blocks, and the retry schedule: the delay
           range before each attempt and the worst-case time at its end
  server   validate a server document (concurrency and rate limits, as
           serviceconfig.ParseServer reads it) and, given a method, explain
           the limits that apply to it

flags (before or after the arguments):
  -max-attempts-cap N  cap on maxAttempts, as serviceconfig.WithMaxAttemptsCap
                       (default 5; N < 2 means 5)
  -attempt-time D      longest time one attempt takes, for the schedule, such
                       as 300ms (default: the policy's perAttemptRecvTimeout,
                       else 0: the schedule then counts delays only)
  -strict              treat warnings as errors
  -lenient             read FILE as grpc-go and a client's WrapResolver read a
                       resolver's config (serviceconfig.Lenient): a typo that
                       changes which methods a policy covers is shown as a
                       warning, and still fails the check

exit status: 0 ok; 1 invalid or unreadable document, warnings with -strict,
or, with -lenient, warnings that change which methods a policy covers;
2 usage error.
`

// options are the flags of both commands.
type options struct {
	maxAttemptsCap int           // ≥ 2: the cap Parse applies
	attemptTime    time.Duration // the -attempt-time flag; used when attemptSet
	attemptSet     bool          // -attempt-time was given
	strict         bool
	lenient        bool // parse with serviceconfig.Lenient
}

// usageError is a bad command line: exit status 2, with the usage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelp asks for the usage on standard output and exit status 0.
var errHelp = errors.New("help requested")

// run is the command: it parses args (without the program name), runs the
// command and returns the exit status. Reports go to stdout, errors and the
// usage after a usage error to stderr.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := dispatch(args, stdin, stdout)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelp):
		io.WriteString(stdout, usage)
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "svcconfig: %s\n\n%s", ue.msg, usage)
		return exitUsage
	default:
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
}

// dispatch runs the command args name. An error other than errHelp and a
// *usageError means exit status 1; its text is the whole message.
func dispatch(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return usagef("no command")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "-help", "--help":
		return errHelp
	case "check", "explain", "server":
	default:
		return usagef("unknown command %q", cmd)
	}
	opts, pos, err := parseFlags(cmd, rest)
	if err != nil {
		return err
	}
	var warnings, coverage int
	switch cmd {
	case "check":
		if len(pos) != 1 {
			return usagef("check takes one FILE, got %d arguments", len(pos))
		}
		data, err := readInput(pos[0], stdin)
		if err != nil {
			return err
		}
		if err := checkKind(cmd, pos[0], data); err != nil {
			return err
		}
		if warnings, coverage, err = check(stdout, data, opts); err != nil {
			return err
		}
	case "explain":
		if len(pos) != 2 {
			return usagef("explain takes FILE and a method, got %d arguments", len(pos))
		}
		method, err := fullMethod(pos[1])
		if err != nil {
			return err
		}
		data, err := readInput(pos[0], stdin)
		if err != nil {
			return err
		}
		if err := checkKind(cmd, pos[0], data); err != nil {
			return err
		}
		if warnings, coverage, err = explain(stdout, data, method, opts); err != nil {
			return err
		}
	case "server":
		if len(pos) != 1 && len(pos) != 2 {
			return usagef("server takes FILE and an optional method, got %d arguments", len(pos))
		}
		method := ""
		if len(pos) == 2 {
			if method, err = fullMethod(pos[1]); err != nil {
				return err
			}
		}
		data, err := readInput(pos[0], stdin)
		if err != nil {
			return err
		}
		if err := checkKind(cmd, pos[0], data); err != nil {
			return err
		}
		if err := server(stdout, data, method); err != nil {
			return err
		}
	}
	if coverage > 0 {
		// With or without -strict: a client refuses the document.
		return fmt.Errorf("svcconfig: failing on %s: serviceconfig.Parse refuses the document "+
			"(grpc-go and a client's WrapResolver read it as shown)",
			plural(coverage, "warning that changes which methods a policy covers", "warnings that change which methods a policy covers"))
	}
	if opts.strict && warnings > 0 {
		return fmt.Errorf("svcconfig: -strict: failing on %s", plural(warnings, "warning", "warnings"))
	}
	return nil
}

// parseFlags parses the flags of cmd, which may come before, between or
// after its positional arguments, and returns those arguments. A "--" ends
// the flags.
func parseFlags(cmd string, args []string) (options, []string, error) {
	var opts options
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints the usage
	fs.IntVar(&opts.maxAttemptsCap, "max-attempts-cap", serviceconfig.DefaultMaxAttemptsCap, "")
	fs.DurationVar(&opts.attemptTime, "attempt-time", 0, "")
	fs.BoolVar(&opts.strict, "strict", false, "")
	fs.BoolVar(&opts.lenient, "lenient", false, "")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return opts, nil, errHelp
			}
			return opts, nil, usagef("%s: %v", cmd, err)
		}
		consumed := len(args) - fs.NArg()
		if consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, fs.Args()...)
			break
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "attempt-time" {
			opts.attemptSet = true
		}
	})
	if opts.attemptTime < 0 {
		return opts, nil, usagef("%s: -attempt-time %v: must not be negative", cmd, opts.attemptTime)
	}
	if opts.maxAttemptsCap < 2 { // as WithMaxAttemptsCap
		opts.maxAttemptsCap = serviceconfig.DefaultMaxAttemptsCap
	}
	return opts, pos, nil
}

// readInput returns the contents of the file name, or of stdin for "-".
func readInput(name string, stdin io.Reader) ([]byte, error) {
	var (
		data []byte
		err  error
	)
	if name == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, fmt.Errorf("svcconfig: %w", err)
	}
	return data, nil
}

// fullMethod checks that m names a method as grpc does, "/package.Service/Method"
// (the leading slash may be left out), and returns it with the slash.
func fullMethod(m string) (string, error) {
	service, method := serviceconfig.SplitMethod(m)
	if service == "" || method == "" {
		return "", usagef("explain: %q is not a full method name such as /package.Service/Method", m)
	}
	if m[0] != '/' {
		m = "/" + m
	}
	return m, nil
}

// plural returns "1 retry" or "n retries".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
