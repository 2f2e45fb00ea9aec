package idemgrpc_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/idemgrpc"
)

// structEntry is the wire form of one entry of a Struct's fields map
// (field 1: key; field 2: a Value whose string_value, field 3, is v).
func structEntry(b []byte, k, v string) []byte {
	var val []byte
	val = protowire.AppendTag(val, 3, protowire.BytesType)
	val = protowire.AppendString(val, v)
	var entry []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, k)
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendBytes(entry, val)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	return protowire.AppendBytes(b, entry)
}

// hashOf decodes wire bytes into a new message like m and returns its
// request hash under DefaultFingerprint.
func hashOf(t *testing.T, m proto.Message, wire []byte) string {
	t.Helper()
	msg := m.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(wire, msg); err != nil {
		t.Fatal(err)
	}
	fields, err := idemgrpc.DefaultFingerprint("/s.v1.S/M", msg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := fingerprint.Hash("op", fields)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// The same message encoded otherwise on the wire (map entries in another
// order, as another language's encoder writes them; a packed repeated
// field unpacked; an unknown field of a newer schema) is the same command;
// another value is not.
func TestDefaultFingerprintIsTheDecodedMessage(t *testing.T) {
	ab := structEntry(structEntry(nil, "from", "acc_1"), "amount", "10.00")
	ba := structEntry(structEntry(nil, "amount", "10.00"), "from", "acc_1")
	unknown := protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), ba...), 99, protowire.VarintType), 7)
	other := structEntry(structEntry(nil, "from", "acc_1"), "amount", "10.01")
	s := &structpb.Struct{}
	h := hashOf(t, s, ab)
	if got := hashOf(t, s, ba); got != h {
		t.Errorf("map entries in another order: %s, want %s", got, h)
	}
	if got := hashOf(t, s, unknown); got != h {
		t.Errorf("with an unknown field: %s, want %s", got, h)
	}
	if got := hashOf(t, s, other); got == h {
		t.Error("another amount hashes alike")
	}

	// SourceCodeInfo.Location.path is a packed repeated int32 (field 1).
	var packed, unpacked []byte
	var list []byte
	for _, v := range []uint64{4, 0, 2} {
		list = protowire.AppendVarint(list, v)
		unpacked = protowire.AppendVarint(protowire.AppendTag(unpacked, 1, protowire.VarintType), v)
	}
	packed = protowire.AppendBytes(protowire.AppendTag(packed, 1, protowire.BytesType), list)
	loc := &descriptorpb.SourceCodeInfo_Location{}
	if a, b := hashOf(t, loc, packed), hashOf(t, loc, unpacked); a != b {
		t.Errorf("packed %s, unpacked %s: want one command", a, b)
	}

	// A method is part of the command.
	fields, err := idemgrpc.DefaultFingerprint("/s.v1.S/Other", s)
	if err != nil {
		t.Fatal(err)
	}
	if other, _ := fingerprint.Hash("op", fields); other == hashOf(t, s, nil) {
		t.Error("two methods hash alike")
	}
	if _, err := idemgrpc.DefaultFingerprint("/s.v1.S/M", "not a message"); err == nil {
		t.Error("a request that is no proto message was fingerprinted")
	}
}

// The fingerprint does not change the request the handler gets: its
// unknown fields stay.
func TestDefaultFingerprintLeavesTheRequestAlone(t *testing.T) {
	wire := protowire.AppendVarint(protowire.AppendTag(structEntry(nil, "a", "b"), 99, protowire.VarintType), 7)
	s := &structpb.Struct{}
	if err := proto.Unmarshal(wire, s); err != nil {
		t.Fatal(err)
	}
	if _, err := idemgrpc.DefaultFingerprint("/s.v1.S/M", s); err != nil {
		t.Fatal(err)
	}
	if len(s.ProtoReflect().GetUnknown()) == 0 {
		t.Error("the request lost its unknown fields")
	}
}

// rawCodec sends and receives a message's bytes as they are: a client
// whose encoder writes fields in an order of its own (another language's).
type rawCodec struct{}

type rawMessage struct{ b []byte }

func (rawCodec) Marshal(v any) ([]byte, error) { return v.(*rawMessage).b, nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	v.(*rawMessage).b = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// On the wire: the same Struct written with its map entries in another
// order is replayed; another value is refused as a reused key.
func TestReencodedRequestOnTheWire(t *testing.T) {
	svc := newTransfers()
	srv := newServer(t, svc, idemgrpc.Options{})
	cc := dial(t, srv.addr, false, false)
	send := func(wire []byte) (*structpb.Struct, metadata.MD, error) {
		var header metadata.MD
		out := new(rawMessage)
		err := cc.Invoke(callCtx(t, "k-wire"), methodCreate, &rawMessage{wire}, out, grpc.ForceCodec(rawCodec{}), grpc.Header(&header))
		if err != nil {
			return nil, header, err
		}
		resp := new(structpb.Struct)
		return resp, header, proto.Unmarshal(out.b, resp)
	}
	first, _, err := send(structEntry(structEntry(nil, "from", "acc_1"), "amount", "10.00"))
	if err != nil {
		t.Fatal(err)
	}
	again, header, err := send(structEntry(structEntry(nil, "amount", "10.00"), "from", "acc_1"))
	if err != nil || !proto.Equal(again, first) || len(header.Get(idemgrpc.MetadataReplayed)) == 0 {
		t.Fatalf("reordered: %v, %v (header %v); want a replay of %v", again, err, header, first)
	}
	_, _, err = send(structEntry(structEntry(nil, "amount", "10.01"), "from", "acc_1"))
	wantCode(t, err, codes.FailedPrecondition, idem.ECodeKeyReused)
	if n := svc.execs.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}
