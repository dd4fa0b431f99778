package idempotency

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	idempotencyv1 "github.com/grpc-resilience/resilience/proto/resilience/idempotency/v1"
)

// FormatVersion is the version of the stored record format written by
// [Record.MarshalBinary], the format_version field of
// resilience.idempotency.v1.Record.
const FormatVersion = 1

// Record is the outcome of the first execution of a call: its status, its
// reply and the metadata its handler set. A duplicate of the call receives
// exactly this.
type Record struct {
	// Fingerprint is the hash of the request that produced the record.
	Fingerprint []byte
	// Code, Message and Details are the call's status.
	Code    codes.Code
	Message string
	Details []*anypb.Any
	// ReplyType is the full name of the reply message type, such as
	// "resilience.echo.v1.EchoResponse"; empty unless Code is OK.
	ReplyType string
	// Reply is the deterministically marshalled reply; nil unless Code is OK.
	Reply []byte
	// Header and Trailer are the response metadata the handler set.
	Header  metadata.MD
	Trailer metadata.MD
}

// recordOverhead is the heap a record holds besides its variable fields:
// the Record struct (128 bytes on 64-bit platforms) inside the allocation
// that holds it, which for the interceptor is its per-call capture of 208
// bytes.
const recordOverhead = 208

// Size returns an estimate of the heap the record holds, in bytes: its
// struct, and each string, slice and metadata map it points to, rounded up
// as the Go allocator rounds allocations (to its size classes up to 32 KiB,
// to 8 KiB pages above). Metadata maps count their header, their slot
// groups at Go's load factor and the slice of each key. Fingerprint and
// ReplyType are not counted: the interceptor's point into its capture
// (counted in the overhead) and into the reply's message descriptor (shared
// by every record of the type). Stores bound records by it. A test measures
// it, with the memory store's entries, within 20% of what runtime.MemStats
// sees.
func (r *Record) Size() int {
	n := recordOverhead + heapBytes(len(r.Message)) + heapBytes(len(r.Reply))
	if len(r.Details) > 0 {
		n += heapBytes(8 * len(r.Details))
		for _, d := range r.Details {
			n += anyOverhead + heapBytes(len(d.GetTypeUrl())) + heapBytes(len(d.GetValue()))
		}
	}
	return n + mdSize(r.Header) + mdSize(r.Trailer)
}

// anyOverhead is the heap of an anypb.Any besides its strings.
const anyOverhead = 80

// Go's swiss-table maps (Go 1.24 on): a map header, and slot groups of 8
// slots and 8 control bytes, filled to 7/8 at most before they double. A
// metadata.MD slot holds a string key (16 bytes) and a []string (24).
const (
	mapHeader    = 48
	mapTable     = 64 // a table and the directory of a map over 8 slots
	mdGroupBytes = 8 + 8*(16+24)
)

func mdSize(md metadata.MD) int {
	if len(md) == 0 {
		return 0 // without starting an iteration
	}
	n := mapHeader
	if len(md) <= 8 {
		n += heapBytes(mdGroupBytes)
	} else {
		slots := 16
		for len(md) > slots*7/8 {
			slots *= 2
		}
		n += mapTable + heapBytes(slots/8*mdGroupBytes)
	}
	for k, vs := range md {
		n += heapBytes(len(k)) + heapBytes(16*cap(vs))
		for _, v := range vs {
			n += heapBytes(len(v))
		}
	}
	return n
}

// sizeClasses are the Go allocator's size classes up to 32 KiB
// (runtime/sizeclasses.go).
var sizeClasses = [...]uint16{8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240,
	256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280, 1408, 1536, 1792,
	2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240,
	10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264, 28672, 32768}

// heapBytes returns the bytes the Go allocator takes for an object of n
// bytes: its size class, or whole 8 KiB pages above 32 KiB; 0 for 0.
func heapBytes(n int) int {
	switch {
	case n <= 0:
		return 0
	case n > 32768:
		return (n + 8191) &^ 8191
	}
	i, _ := slices.BinarySearch(sizeClasses[:], uint16(n))
	return int(sizeClasses[i])
}

// MarshalBinary encodes the record as a resilience.idempotency.v1.Record
// with FormatVersion, deterministically (metadata keys sorted).
func (r *Record) MarshalBinary() ([]byte, error) {
	pb := &idempotencyv1.Record{
		FormatVersion: FormatVersion,
		Fingerprint:   r.Fingerprint,
		Code:          int32(r.Code),
		Message:       r.Message,
		Details:       r.Details,
		ReplyType:     r.ReplyType,
		Reply:         r.Reply,
		Header:        mdToProto(r.Header),
		Trailer:       mdToProto(r.Trailer),
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pb)
}

// ErrUnknownFormat is wrapped by the error of [Record.UnmarshalBinary] for a
// record whose format version this package does not know.
var ErrUnknownFormat = errors.New("idempotency: unknown record format version")

// UnmarshalBinary decodes a record written by MarshalBinary. It refuses a
// record whose format version is not FormatVersion.
func (r *Record) UnmarshalBinary(data []byte) error {
	var pb idempotencyv1.Record
	if err := proto.Unmarshal(data, &pb); err != nil {
		return fmt.Errorf("idempotency: decoding record: %w", err)
	}
	if pb.FormatVersion != FormatVersion {
		return fmt.Errorf("%w %d (want %d)", ErrUnknownFormat, pb.FormatVersion, FormatVersion)
	}
	*r = Record{
		Fingerprint: pb.Fingerprint,
		Code:        codes.Code(pb.Code),
		Message:     pb.Message,
		Details:     pb.Details,
		ReplyType:   pb.ReplyType,
		Reply:       pb.Reply,
		Header:      mdFromProto(pb.Header),
		Trailer:     mdFromProto(pb.Trailer),
	}
	return nil
}

func mdToProto(md metadata.MD) []*idempotencyv1.MetadataEntry {
	if len(md) == 0 {
		return nil
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]*idempotencyv1.MetadataEntry, len(keys))
	for i, k := range keys {
		vs := make([][]byte, len(md[k]))
		for j, v := range md[k] {
			vs[j] = []byte(v)
		}
		out[i] = &idempotencyv1.MetadataEntry{Key: k, Values: vs}
	}
	return out
}

func mdFromProto(es []*idempotencyv1.MetadataEntry) metadata.MD {
	if len(es) == 0 {
		return nil
	}
	md := make(metadata.MD, len(es))
	for _, e := range es {
		vs := make([]string, len(e.Values))
		for j, v := range e.Values {
			vs[j] = string(v)
		}
		md[e.Key] = append(md[e.Key], vs...)
	}
	return md
}
