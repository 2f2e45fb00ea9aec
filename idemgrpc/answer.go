package idemgrpc

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
)

// SchemaVersion is the idem.Response.SchemaVersion of a stored gRPC
// answer. Its Status is the HTTP status of the answer's gRPC code (200 for
// a response message, as gRPC's HTTP mapping gives it for a status), so
// that an operator's tools read it like any record; its Body is the
// response message in deterministic proto encoding, or a google.rpc.Status
// (code, message, details); its Headers hold the response message's type
// (headerType) and the stored metadata (headerPrefix, trailerPrefix).
const SchemaVersion = "grpc/1"

// Names in a stored answer's Headers.
const (
	headerType    = "grpc-type"
	headerPrefix  = "header/"
	trailerPrefix = "trailer/"
)

// DefaultClass is how a handler's answer is stored when it does not
// Classify it: a response (codes.OK) is COMPLETED; INVALID_ARGUMENT,
// NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, FAILED_PRECONDITION,
// OUT_OF_RANGE and UNIMPLEMENTED, deterministic rejections, are
// FAILED_REPLAYABLE (stored and replayed); CANCELLED, UNKNOWN,
// DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNAVAILABLE,
// DATA_LOSS and UNAUTHENTICATED are FAILED_RETRYABLE (not stored: a retry
// executes again), as idemhttp.DefaultClass treats 408, 409, 429 and 5xx.
// UNAUTHENTICATED is retryable because an auth failure is never stored.
func DefaultClass(c codes.Code) idem.Status {
	switch c {
	case codes.OK:
		return idem.StatusCompleted
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented:
		return idem.StatusFailedReplayable
	}
	return idem.StatusFailedRetryable
}

// httpStatus is the HTTP status of a gRPC code (gRPC's own mapping, as
// google.rpc.Code documents it), recorded with a stored answer.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Result returns the engine.Result that records a handler's answer (resp,
// err) as the interceptor stores it, classified by DefaultClass: what an
// operation's Recover (Method.Recover) returns for an answer it learnt
// downstream, so that the retry replays it as the handler's own. resp must
// be a proto.Message when err is nil; err is a gRPC status error
// (status.Error), or any other error, which answers UNKNOWN as gRPC does.
func Result(resp any, err error) (engine.Result, error) {
	return encode(resp, err, "", nil, nil, nil, nil, 0)
}

// errTooLarge says an answer is larger than may be stored.
var errTooLarge = errors.New("idemgrpc: answer too large to store")

// encode is the result that records an answer: resp (a proto.Message) or
// err's status, classified by class (or DefaultClass), with the header
// metadata named in replayHeaders and the trailer metadata named in
// replayTrailers (lower-case names). With limit above zero, an answer
// whose body is larger fails with errTooLarge.
func encode(resp any, err error, class idem.Status, replayHeaders, replayTrailers []string, header, trailer metadata.MD, limit int) (engine.Result, error) {
	var (
		code codes.Code
		body []byte
		typ  string
	)
	if err != nil {
		st := status.Convert(err)
		code = st.Code()
		if code == codes.OK {
			// status.Error(codes.OK, ...) is no error to gRPC: it sends
			// UNKNOWN with it, and so do we.
			st = status.New(codes.Unknown, st.Message())
			code = codes.Unknown
		}
		if limit > 0 && proto.Size(st.Proto()) > limit {
			return engine.Result{}, errTooLarge
		}
		body, err = proto.MarshalOptions{Deterministic: true}.Marshal(st.Proto())
		if err != nil {
			return engine.Result{}, fmt.Errorf("idemgrpc: encode status: %w", err)
		}
	} else {
		msg, ok := resp.(proto.Message)
		if !ok || msg == nil {
			return engine.Result{}, fmt.Errorf("idemgrpc: the response is a %T, not a proto.Message", resp)
		}
		if limit > 0 && proto.Size(msg) > limit {
			return engine.Result{}, errTooLarge
		}
		body, err = proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		if err != nil {
			return engine.Result{}, fmt.Errorf("idemgrpc: encode response: %w", err)
		}
		typ = string(msg.ProtoReflect().Descriptor().FullName())
	}
	if class == "" {
		class = DefaultClass(code)
	}
	headers := map[string]string{}
	if typ != "" {
		headers[headerType] = typ
	}
	for _, name := range replayHeaders {
		if v := header.Get(name); len(v) > 0 {
			headers[headerPrefix+name] = storedValue(name, v[0])
		}
	}
	for _, name := range replayTrailers {
		if v := trailer.Get(name); len(v) > 0 {
			headers[trailerPrefix+name] = storedValue(name, v[0])
		}
	}
	if body == nil {
		body = []byte{}
	}
	res := engine.Result{Status: class, Response: idem.Response{Status: httpStatus(code), Headers: headers, Body: body, SchemaVersion: SchemaVersion}}
	if class == idem.StatusFailedReplayable || class == idem.StatusFailedRetryable {
		res.ErrorCode = "GRPC_" + CodeName(code)
	}
	return res, nil
}

// CodeName returns the canonical name of a gRPC code, as google.rpc.Code
// and service configs spell it (INVALID_ARGUMENT, CANCELLED).
func CodeName(c codes.Code) string {
	if n, ok := rpccode.Code_name[int32(c)]; ok {
		return n
	}
	return "UNKNOWN"
}

// storedValue is how a metadata value is kept: a binary one (-bin)
// base64-encoded, as the store keeps text.
func storedValue(name, v string) string {
	if strings.HasSuffix(name, "-bin") {
		return base64.StdEncoding.EncodeToString([]byte(v))
	}
	return v
}

// stored is a stored answer as it is replayed.
type stored struct {
	resp            proto.Message
	err             error
	header, trailer metadata.MD
}

// decode reads a stored answer.
func decode(r idem.Response) (stored, error) {
	if r.SchemaVersion != SchemaVersion {
		return stored{}, fmt.Errorf("idemgrpc: a stored answer of schema %q is not a gRPC answer", r.SchemaVersion)
	}
	var out stored
	for k, v := range r.Headers {
		name, md := k, &out.header
		if n, ok := strings.CutPrefix(k, headerPrefix); ok {
			name = n
		} else if n, ok := strings.CutPrefix(k, trailerPrefix); ok {
			name, md = n, &out.trailer
		} else {
			continue
		}
		if strings.HasSuffix(name, "-bin") {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				return stored{}, fmt.Errorf("idemgrpc: stored metadata %q: %w", name, err)
			}
			v = string(b)
		}
		if *md == nil {
			*md = metadata.MD{}
		}
		md.Append(name, v)
	}
	typ, ok := r.Headers[headerType]
	if !ok {
		var p spb.Status
		if err := proto.Unmarshal(r.Body, &p); err != nil {
			return stored{}, fmt.Errorf("idemgrpc: stored status: %w", err)
		}
		out.err = status.FromProto(&p).Err()
		return out, nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(typ))
	if err != nil {
		return stored{}, fmt.Errorf("idemgrpc: stored response of type %q: %w", typ, err)
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(r.Body, msg); err != nil {
		return stored{}, fmt.Errorf("idemgrpc: stored response: %w", err)
	}
	out.resp = msg
	return out, nil
}

// call is what the interceptor knows of one execution of a handler: the
// metadata it set (it runs behind a stream of the interceptor's own, so
// that its metadata goes to the client only with its answer, once) and the
// class it chose.
type call struct {
	method string
	mu     sync.Mutex
	header metadata.MD
	// trailer is the handler's trailer metadata.
	trailer metadata.MD
	class   idem.Status
	attempt *engine.Attempt
}

var _ grpc.ServerTransportStream = (*call)(nil)

func (c *call) Method() string { return c.method }

func (c *call) SetHeader(md metadata.MD) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.header = metadata.Join(c.header, md)
	return nil
}

// SendHeader keeps md like SetHeader: the header goes out with the answer,
// after it was stored.
func (c *call) SendHeader(md metadata.MD) error { return c.SetHeader(md) }

func (c *call) SetTrailer(md metadata.MD) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trailer = metadata.Join(c.trailer, md)
	return nil
}

type callKey struct{}

// Classify sets how the answer of the handler running with ctx is stored
// (idem.StatusCompleted, StatusFailedReplayable, StatusFailedRetryable or
// StatusUnknown), instead of DefaultClass of its code: StatusUnknown for a
// failure after a side effect whose outcome the operation's Recover must
// settle, StatusFailedReplayable for a business rejection that should be
// replayed whatever its code. Outside the interceptor it does nothing.
func Classify(ctx context.Context, s idem.Status) {
	if c, ok := ctx.Value(callKey{}).(*call); ok {
		c.mu.Lock()
		c.class = s
		c.mu.Unlock()
	}
}

// AttemptFrom returns the engine attempt the handler running with ctx runs
// under (its lease and fencing token, for checkpoints and downstream
// calls), or nil outside the interceptor.
func AttemptFrom(ctx context.Context) *engine.Attempt {
	if c, ok := ctx.Value(callKey{}).(*call); ok {
		return c.attempt
	}
	return nil
}
