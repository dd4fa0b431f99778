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

// recordOverhead is added to a record's Size for its fixed fields.
const recordOverhead = 64

// Size returns an estimate of the record's size in bytes: the lengths of its
// variable fields plus a fixed overhead. Stores bound records by it.
func (r *Record) Size() int {
	n := recordOverhead + len(r.Fingerprint) + len(r.Message) + len(r.ReplyType) + len(r.Reply)
	for _, d := range r.Details {
		n += len(d.GetTypeUrl()) + len(d.GetValue()) + 8
	}
	return n + mdSize(r.Header) + mdSize(r.Trailer)
}

func mdSize(md metadata.MD) int {
	if len(md) == 0 {
		return 0 // without starting an iteration
	}
	n := 0
	for k, vs := range md {
		n += len(k) + 8
		for _, v := range vs {
			n += len(v) + 4
		}
	}
	return n
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
