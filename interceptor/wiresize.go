package interceptor

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"
)

// The replay buffer (WithStreamReplayBuffer) counts what grpc-go's per-call
// retry buffer counts: each message sent, encoded by the call's codec, plus
// gRPC's 5-byte message prefix. One rule for unary calls and streams, and
// for every kind of message:
//
//   - with the default codec, a proto message counts proto.Size(m) + 5,
//     computed without encoding it;
//   - any other message, or any message of a call whose codec a call option
//     chose (grpc.ForceCodec, grpc.ForceCodecV2, grpc.CallContentSubtype,
//     also as grpc.WithDefaultCallOptions), is encoded by that codec (the
//     codec registered for the content-subtype, "proto" by default) to be
//     measured: once per message sent before the commit on a stream, once
//     per failed attempt on a unary call;
//   - a message no codec can encode counts as past the bound: grpc would
//     fail to send it anyway.
//
// grpc-go counts compressed messages at their compressed size; the client
// counts them uncompressed (it sees the messages before grpc compresses
// them), so with compression a call may commit here a little sooner.

// wireSizer measures messages as the call's codec sends them. Its zero value
// is the default: the codec registered for "proto".
type wireSizer struct {
	// forced is the codec a call option forced: an encoding.CodecV2, an
	// encoding.Codec or a grpc.Codec; nil when none did.
	forced any
	// subtype is the call's content-subtype (lowercase); "" for the
	// default.
	subtype string
}

// size returns what m counts toward a replay buffer of limit bytes: its
// encoded size plus the 5-byte prefix, or limit + 1 when it cannot be
// encoded.
func (z wireSizer) size(m any, limit int) int {
	if z.forced == nil && (z.subtype == "" || z.subtype == "proto") {
		if pm, ok := m.(proto.Message); ok {
			return proto.Size(pm) + grpcMessagePrefix
		}
	}
	n, ok := z.encodedLen(m)
	if !ok {
		return limit + 1
	}
	return n + grpcMessagePrefix
}

// encodedLen encodes m with the call's codec, as grpc would choose it (a
// forced codec, else the one registered for the content-subtype, a v1
// registration first), and returns the encoding's length.
func (z wireSizer) encodedLen(m any) (int, bool) {
	switch c := z.forced.(type) {
	case encoding.CodecV2:
		return lenV2(c, m)
	case interface{ Marshal(any) ([]byte, error) }: // encoding.Codec, grpc.Codec
		return lenV1(c, m)
	}
	name := z.subtype
	if name == "" {
		name = "proto"
	}
	if c := encoding.GetCodec(name); c != nil {
		return lenV1(c, m)
	}
	if c := encoding.GetCodecV2(name); c != nil {
		return lenV2(c, m)
	}
	return 0, false
}

func lenV1(c interface{ Marshal(any) ([]byte, error) }, m any) (int, bool) {
	b, err := c.Marshal(m)
	return len(b), err == nil
}

func lenV2(c encoding.CodecV2, m any) (int, bool) {
	b, err := c.Marshal(m)
	if err != nil {
		return 0, false
	}
	defer b.Free()
	return b.Len(), true
}
