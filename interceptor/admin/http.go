package admin

import (
	_ "embed"
	"html/template"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// Handler returns the view over HTTP, for a debug port. Mount it under a
// path of your choosing with http.StripPrefix, the path ending in a slash:
//
//	mux.Handle("/debug/resilience/", http.StripPrefix("/debug/resilience", v.Handler()))
//
// It serves, below that path:
//
//	GET  /             a plain HTML page an operator reads without tools
//	                   (?refresh=N reloads it every N seconds)
//	GET  /view.json    the view, as AdminService.GetView's View in protojson
//	GET  /events.json  the events (?after=SEQUENCE&max=N), as ListEvents
//	POST /breaker      a breaker action, a ControlBreakerRequest in
//	                   protojson with Content-Type application/json;
//	                   refused (403) unless the View has WithWrites and
//	                   its Authorizer allows it
//
// The page and the JSON are read-only; the page has no script and no form.
func (v *View) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", v.servePage)
	mux.HandleFunc("GET /view.json", v.serveView)
	mux.HandleFunc("GET /events.json", v.serveEvents)
	mux.HandleFunc("POST /breaker", v.serveBreaker)
	return mux
}

var jsonOut = protojson.MarshalOptions{Multiline: true, Indent: "  "}

func writeJSON(w http.ResponseWriter, code int, m proto.Message) {
	b, err := jsonOut.Marshal(m)
	if err != nil {
		http.Error(w, "admin: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

func (v *View) serveView(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, v.Snapshot())
}

func (v *View) serveEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, err1 := parseUint(q.Get("after"))
	limit, err2 := parseUint(q.Get("max"))
	if err1 != nil || err2 != nil || limit > 1<<20 {
		http.Error(w, "admin: after and max must be non-negative integers", http.StatusBadRequest)
		return
	}
	v.pollEndpoints()
	events, dropped := v.Events(after, int(limit))
	writeJSON(w, http.StatusOK, &adminv1.ListEventsResponse{Events: events, Dropped: dropped})
}

func parseUint(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// maxWriteBody bounds a write's request body.
const maxWriteBody = 64 << 10

// serveBreaker runs a breaker action. It insists on a JSON body: a browser
// sends one across origins only after a preflight that this handler does
// not answer, so a page elsewhere cannot make an operator's browser post
// it.
func (v *View) serveBreaker(w http.ResponseWriter, r *http.Request) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "admin: a write takes a JSON body (Content-Type: application/json)", http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWriteBody))
	if err != nil {
		http.Error(w, "admin: reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var req adminv1.ControlBreakerRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "admin: the body is not a ControlBreakerRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	b, err := v.write(r.Context(), Write{Action: actionOf(req.GetAction()), Client: req.GetClient(), FullMethod: req.GetFullMethod(), HTTP: r}, r.RemoteAddr)
	if err != nil {
		http.Error(w, status.Convert(err).Message(), httpStatus(status.Code(err)))
		return
	}
	writeJSON(w, http.StatusOK, &adminv1.ControlBreakerResponse{Breaker: b})
}

func httpStatus(c codes.Code) int {
	switch c {
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.FailedPrecondition:
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

//go:embed page.html
var pageHTML string

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"time": func(t *timestamppb.Timestamp) string {
		if t == nil {
			return ""
		}
		return t.AsTime().Local().Format("15:04:05.000")
	},
	"part":  adminv1.Part.Label,
	"state": adminv1.BreakerState.Label,
	"kind":  adminv1.EventKind.Label,
	"addrs": func(a []string) string { return strings.Join(a, ", ") },
	"pct":   func(f float64) string { return strconv.FormatFloat(100*f, 'f', 0, 64) + "%" },
	"dur": func(d *durationpb.Duration) string {
		if d == nil {
			return ""
		}
		return d.AsDuration().String()
	},
	"refuse": refuses,
}).Parse(pageHTML))

// page is what the template reads.
type page struct {
	View    *adminv1.View
	Events  []*adminv1.Event // newest first
	Dropped uint64
	Refresh int
}

// pageEvents is how many of the newest events the page shows.
const pageEvents = 100

func (v *View) servePage(w http.ResponseWriter, r *http.Request) {
	p := page{View: v.Snapshot()}
	if n, err := strconv.Atoi(r.URL.Query().Get("refresh")); err == nil && n > 0 {
		p.Refresh = min(n, 3600)
	}
	p.Events, p.Dropped = v.Events(0, pageEvents)
	slices.Reverse(p.Events)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := pageTmpl.Execute(w, p); err != nil {
		// The header is out: all that is left is to say so in the page.
		_, _ = io.WriteString(w, "<p>admin: rendering the page failed: "+template.HTMLEscapeString(err.Error())+"</p>")
	}
}
