package idemgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/internal/telemetry"
)

// Metadata names of the contract (gRPC metadata names are lower case).
const (
	// MetadataKey is the request metadata that carries the idempotency key.
	MetadataKey = "idempotency-key"
	// MetadataReplayed is sent as "true" in the header metadata of a
	// replayed answer.
	MetadataReplayed = "idempotent-replayed"
	// MetadataWindow is the trailer metadata of every answer of a covered
	// method: the replay window in seconds (HTTP's Idempotency-Window).
	MetadataWindow = "idempotency-window"
)

// DefaultMaxResponseBody is the default Options.MaxResponseBody.
const DefaultMaxResponseBody = 1 << 20

// FingerprintFunc returns the normalised command of a call: the fields
// fingerprint.Hashes hashes with the operation name. req is the decoded
// request message.
type FingerprintFunc func(fullMethod string, req any) (map[string]any, error)

// Method is how the interceptor serves one method.
type Method struct {
	// Operation is the method's operation name (the scope's middle part,
	// idem.ValidOperation's syntax). Default DefaultOperation(the full
	// method name). Methods may share an operation: the full method name
	// is part of the fingerprint, so one key used with two methods is a
	// key reused with another command.
	Operation string
	// Recover, optional, settles a record a crashed or lost execution
	// left behind (engine.Operation.Recover); it builds its result with
	// Result, so that a retry replays it as the handler's own answer.
	Recover engine.ExecuteFunc
}

// Options configure New.
type Options struct {
	// Tenant returns the tenant of an authenticated call from its context
	// (its peer's certificate, a token in its metadata checked by an
	// earlier interceptor). Required. An error (or "") answers
	// UNAUTHENTICATED and stores nothing. There is no default, because the
	// tenant must come from the authenticated principal, never from a
	// client-chosen field.
	Tenant func(ctx context.Context) (string, error)
	// Methods are the unary methods made idempotent, by full method name
	// ("/package.Service/Method"); other methods pass through untouched.
	// Nil: every unary method, each as the operation DefaultOperation
	// names, reads and health checks included (each then needs a key):
	// name the methods that act instead.
	Methods map[string]Method
	// Fingerprint normalises a call. Default DefaultFingerprint.
	Fingerprint FingerprintFunc
	// ReplayHeaders and ReplayTrailers name the handler's header and
	// trailer metadata that is stored and replayed (the first value of
	// each; -bin values too). Default: none. All the metadata a handler
	// sets goes to the client of the execution.
	ReplayHeaders, ReplayTrailers []string
	// Window is the replay window. Default engine.DefaultWindow (24h).
	Window time.Duration
	// LockFor bounds one execution of the handler (its context ends
	// then) and is how long a crashed owner blocks a retry. Default
	// engine.DefaultLockFor (30s).
	//
	// Window, LockFor and Method.Recover make an operation's
	// registration: when the engine has the operation already, that
	// registration decides them, and New refuses them set to other
	// values.
	LockFor time.Duration
	// Wait is how long a call that finds its key in progress is held for
	// the first answer before it answers ABORTED
	// IDEMPOTENCY_REQUEST_IN_PROGRESS (capped by the engine's MaxWait and
	// by the call's deadline). Default 0: at once.
	Wait time.Duration
	// MaxResponseBody bounds the answer stored (the response message or
	// the status, encoded). A handler that answers more has acted but its
	// answer cannot be replayed: the client gets INTERNAL
	// IDEMPOTENCY_RESPONSE_TOO_LARGE, and the record is left
	// UNKNOWN_REQUIRES_RECOVERY (FAILED_RETRYABLE for a retryable class).
	// Default DefaultMaxResponseBody (1 MiB).
	MaxResponseBody int
	// Errors is the table error codes answer by (their HTTP status decides
	// the gRPC code of an operation's own code, and their Retry-After the
	// RetryInfo detail). Default idemhttp.DefaultErrors().
	Errors *idemhttp.Errors
	// Logger receives internal errors. Default: discard.
	Logger *slog.Logger
	// Metrics, when set, counts the calls by operation and outcome
	// (idemprom.NewGRPC makes the counter
	// idemgrpc_requests_total{operation,outcome}).
	Metrics Metrics
	// TracerProvider, when set, traces each call of a covered method with
	// a span (continuing the span in the call's context, or the W3C trace
	// context of its traceparent metadata); the engine's and the store's
	// spans are its children. Default: no spans of its own.
	TracerProvider trace.TracerProvider
}

// Metrics counts what the interceptor answers. Package idemprom implements
// it (NewGRPC) with Prometheus counters; idemgrpc imports no metrics
// library.
type Metrics interface {
	// Requests is called once per operation with its name and returns
	// what counts that operation's calls by outcome (one of
	// idem.OutcomeLabels(): the engine's outcome, idem.LabelRejected for a
	// call refused before it, idem.LabelError for an answer it could not
	// give), once per call, concurrently.
	Requests(operation string) func(outcome string)
}

// Interceptor serves unary calls of covered methods through the engine.
// It is safe for concurrent use.
type Interceptor struct {
	eng    *engine.Engine
	opts   Options
	tracer trace.Tracer

	mu  sync.Mutex
	ops map[string]*operation // by full method name
}

// operation is a covered method as registered with the engine.
type operation struct {
	name        string
	window      string
	unknownCode string
	count       func(outcome string)
}

// New returns an Interceptor over e. It registers the operations of
// Options.Methods with e (unless e has them already; with Methods nil,
// each method's operation is registered at its first call). It fails when
// the options cannot work (no tenant source, an operation name that is
// not valid, an operation the engine has already with another Recover,
// Window or LockFor).
func New(e *engine.Engine, opts Options) (*Interceptor, error) {
	if opts.Tenant == nil {
		return nil, errors.New("idemgrpc: Options.Tenant is required")
	}
	if opts.Fingerprint == nil {
		opts.Fingerprint = DefaultFingerprint
	}
	if opts.MaxResponseBody <= 0 {
		opts.MaxResponseBody = DefaultMaxResponseBody
	}
	if opts.Errors == nil {
		opts.Errors = idemhttp.DefaultErrors()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Methods = maps.Clone(opts.Methods)
	lower := func(names []string) []string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = strings.ToLower(n)
		}
		return out
	}
	opts.ReplayHeaders, opts.ReplayTrailers = lower(opts.ReplayHeaders), lower(opts.ReplayTrailers)
	ic := &Interceptor{eng: e, opts: opts, ops: map[string]*operation{}}
	if opts.TracerProvider != nil {
		ic.tracer = telemetry.Tracer(opts.TracerProvider)
	}
	for _, full := range slices.Sorted(maps.Keys(opts.Methods)) {
		if _, err := ic.operation(full); err != nil {
			return nil, err
		}
	}
	return ic, nil
}

// DefaultOperation is the operation name of a method that Options.Methods
// does not name: its full method name in lower case, without the leading
// '/', with '/' written '.' ("/payments.v1.Payments/Create" is
// "payments.v1.payments.create"). A name longer than
// idem.MaxOperationLen is not valid: name such a method's operation.
func DefaultOperation(fullMethod string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(fullMethod, "/")), "/", ".")
}

// operation returns the covered method fullMethod's operation, registering
// it with the engine at first use; nil when the method is not covered.
func (ic *Interceptor) operation(fullMethod string) (*operation, error) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if op, ok := ic.ops[fullMethod]; ok {
		return op, nil
	}
	m, named := ic.opts.Methods[fullMethod]
	if !named && ic.opts.Methods != nil {
		return nil, nil
	}
	if m.Operation == "" {
		m.Operation = DefaultOperation(fullMethod)
	}
	if !idem.ValidOperation(m.Operation) {
		return nil, fmt.Errorf("idemgrpc: method %q: operation %q is not a valid operation name (1 to %d of a-z, 0-9, '_', '.', '-'); name it in Options.Methods",
			fullMethod, m.Operation, idem.MaxOperationLen)
	}
	reg, registered := ic.eng.Operation(m.Operation)
	switch {
	case registered && ic.ownsOperation(m.Operation):
		// Another method of ours registered it: the same settings.
		if m.Recover != nil {
			return nil, fmt.Errorf("idemgrpc: method %q: operation %q is shared with another method; only its registration decides Recover", fullMethod, m.Operation)
		}
	case registered:
		if m.Recover != nil || (ic.opts.Window != 0 && ic.opts.Window != reg.Window) || (ic.opts.LockFor != 0 && ic.opts.LockFor != reg.LockFor) {
			return nil, fmt.Errorf("idemgrpc: operation %q is registered with the engine already, which decides its Recover, Window and LockFor; set them there", m.Operation)
		}
	default:
		if err := ic.eng.Register(engine.Operation{Name: m.Operation, Recover: m.Recover, Window: ic.opts.Window, LockFor: ic.opts.LockFor}); err != nil {
			return nil, fmt.Errorf("idemgrpc: %w", err)
		}
		reg, _ = ic.eng.Operation(m.Operation)
	}
	op := &operation{name: m.Operation, window: strconv.FormatInt(int64(reg.Window/time.Second), 10), unknownCode: reg.UnknownCode}
	if ic.opts.Metrics != nil {
		op.count = ic.opts.Metrics.Requests(m.Operation)
	}
	ic.ops[fullMethod] = op
	return op, nil
}

// ownsOperation reports whether a method of ours serves operation name.
func (ic *Interceptor) ownsOperation(name string) bool {
	for _, op := range ic.ops {
		if op.name == name {
			return true
		}
	}
	return false
}

// Unary returns the unary server interceptor.
func (ic *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return ic.unary
}

func (ic *Interceptor) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	op, err := ic.operation(info.FullMethod)
	if err != nil {
		ic.opts.Logger.ErrorContext(ctx, "method not served", "method", info.FullMethod, "err", err)
		st, trailer := codeStatus(ic.opts.Errors, idem.ECodeInternal, "Internal error.")
		return nil, answerError(ctx, st, trailer)
	}
	if op == nil {
		return handler(ctx, req)
	}
	var span trace.Span
	if ic.tracer != nil {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			if md, ok := metadata.FromIncomingContext(ctx); ok {
				ctx = propagation.TraceContext{}.Extract(ctx, metadataCarrier(md))
			}
		}
		ctx, span = ic.tracer.Start(ctx, "idemgrpc "+info.FullMethod, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("rpc.method", info.FullMethod),
				attribute.String("idem.operation", op.name)))
		defer span.End()
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs(MetadataWindow, op.window))
	resp, outcome, err := ic.serve(ctx, op, req, info, handler)
	if op.count != nil {
		op.count(outcome)
	}
	if span != nil {
		span.SetAttributes(attribute.String("idem.outcome", outcome))
		if code := ErrorCode(err); code != "" {
			span.SetAttributes(attribute.String("idem.error_code", code))
		}
		if outcome == idem.LabelError {
			span.SetStatus(otelcodes.Error, "call failed")
		}
	}
	return resp, err
}

// serve answers one call of a covered method and says how (an outcome
// Metrics counts).
func (ic *Interceptor) serve(ctx context.Context, op *operation, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, string, error) {
	fail := func(outcome string, err error) (any, string, error) {
		st, trailer := errorStatus(ctx, ic.opts.Errors, ic.opts.Logger, info.FullMethod, err)
		return nil, outcome, answerError(ctx, st, trailer)
	}
	tenant, err := ic.opts.Tenant(ctx)
	if err != nil || tenant == "" {
		return fail(idem.LabelRejected, &idem.Error{Code: idem.ECodeUnauthenticated, Message: "A valid credential is required.", Err: err})
	}
	md, _ := metadata.FromIncomingContext(ctx)
	key, err := KeyFromMetadata(md)
	if err != nil {
		return fail(idem.LabelRejected, err)
	}
	var rejected bool
	// c is the last execution's call: the one that answered when
	// ans.Executed.
	var (
		c       *call
		resp    any
		herr    error
		tooBig  bool
		encoded error
	)
	ans, err := ic.eng.Do(ctx, engine.Request{
		Operation: op.name, Tenant: tenant, Key: key, Wait: ic.opts.Wait,
		Fingerprint: func() ([]string, error) {
			fields, err := ic.opts.Fingerprint(info.FullMethod, req)
			if err != nil {
				rejected = true
				return nil, clientError(err)
			}
			return fingerprint.Hashes(op.name, fields)
		},
		Execute: func(ctx context.Context, a *engine.Attempt) (engine.Result, error) {
			c = &call{method: info.FullMethod, attempt: a}
			hctx := grpc.NewContextWithServerTransportStream(context.WithValue(ctx, callKey{}, c), c)
			resp, herr = handler(hctx, req)
			c.mu.Lock()
			class, header, trailer := c.class, c.header, c.trailer
			c.mu.Unlock()
			res, err := encode(resp, herr, class, ic.opts.ReplayHeaders, ic.opts.ReplayTrailers, header, trailer, ic.opts.MaxResponseBody)
			switch {
			case errors.Is(err, errTooLarge):
				tooBig = true
				if class == "" {
					class = DefaultClass(status.Code(herr))
				}
				if class != idem.StatusFailedRetryable {
					class = idem.StatusUnknown
				}
				return engine.Result{Status: class, ErrorCode: idem.ECodeResponseTooLarge}, nil
			case err != nil:
				// The handler ran, and its answer cannot be stored: the
				// record waits for recovery.
				encoded = err
				return engine.Result{}, err
			}
			return res, nil
		},
	})
	switch {
	case err != nil && rejected:
		return fail(idem.LabelRejected, err)
	case err != nil && encoded != nil:
		return fail(idem.LabelError, err)
	case err != nil:
		return fail(idem.ErrorLabel(err), err)
	}
	switch {
	case ans.Replayed:
		return ic.replay(ctx, ans, true, "replay")
	case ans.Executed && tooBig:
		ic.opts.Logger.ErrorContext(ctx, "answer larger than MaxResponseBody; record left for recovery",
			"method", info.FullMethod, "limit", ic.opts.MaxResponseBody)
		return fail(idem.LabelError, idem.Errorf(idem.ECodeResponseTooLarge, "The answer is too large to be stored for replay; retry with the same key later."))
	case ans.Executed:
		// The first answer, with all the metadata the handler set.
		c.mu.Lock()
		header, trailer := c.header, c.trailer
		c.mu.Unlock()
		if len(header) > 0 {
			_ = grpc.SetHeader(ctx, header)
		}
		if len(trailer) > 0 {
			_ = grpc.SetTrailer(ctx, trailer)
		}
		return resp, ans.Outcome.String(), herr
	case ans.Stored && ans.Response.Status != 0:
		return ic.replay(ctx, ans, false, ans.Outcome.String())
	case ans.Status == idem.StatusUnknown:
		return fail(ans.Outcome.String(), idem.Errorf(op.unknownCode, "The outcome of the call with this idempotency key is not known yet; retry with the same key later."))
	case ans.Status == idem.StatusFailedRetryable:
		return fail(ans.Outcome.String(), idem.Errorf(idem.ECodeUnavailable, "The call did not take effect; retry with the same key."))
	default:
		// Settled by the operation's Recover: what it answered.
		return ic.replay(ctx, ans, false, ans.Outcome.String())
	}
}

// replay answers a stored answer.
func (ic *Interceptor) replay(ctx context.Context, ans engine.Answer, replayed bool, outcome string) (any, string, error) {
	if ans.Response.SchemaVersion == idemhttp.NotStoredSchema {
		st, trailer := codeStatus(ic.opts.Errors, idem.ECodeResponseNotStored, "The first answer to this idempotency key was not stored, so it cannot be replayed; the call is not executed again.")
		return nil, outcome, answerError(ctx, st, trailer)
	}
	s, err := decode(ans.Response)
	if err != nil {
		ic.opts.Logger.ErrorContext(ctx, "stored answer cannot be replayed", "err", err)
		st, trailer := codeStatus(ic.opts.Errors, idem.ECodeInternal, "Internal error.")
		return nil, idem.LabelError, answerError(ctx, st, trailer)
	}
	header := s.header
	if replayed {
		header = metadata.Join(header, metadata.Pairs(MetadataReplayed, "true"))
	}
	if len(header) > 0 {
		_ = grpc.SetHeader(ctx, header)
	}
	if len(s.trailer) > 0 {
		_ = grpc.SetTrailer(ctx, s.trailer)
	}
	if s.err != nil {
		return nil, outcome, s.err
	}
	return s.resp, outcome, nil
}

// DefaultFingerprint is the default Options.Fingerprint: the full method
// name, the request message's type and the SHA-256 of its deterministic
// proto encoding (proto.MarshalOptions{Deterministic: true}) without its
// unknown fields. The message is re-encoded from what the server decoded,
// so that fields in another order on the wire, packed or unpacked repeated
// fields and map entries in any order are the same command; unknown
// fields (of a newer schema than the server's) are not part of the command
// the server executes. A request that is not a proto.Message cannot be
// fingerprinted (an error).
func DefaultFingerprint(fullMethod string, req any) (map[string]any, error) {
	msg, ok := req.(proto.Message)
	if !ok || msg == nil {
		return nil, fmt.Errorf("idemgrpc: the request is a %T, not a proto.Message", req)
	}
	if hasUnknown(msg.ProtoReflect()) {
		msg = proto.Clone(msg)
		discardUnknown(msg.ProtoReflect())
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, &idem.Error{Code: idem.ECodeValidationFailed, Message: "The request message cannot be encoded.", Err: err}
	}
	sum := sha256.Sum256(b)
	return map[string]any{
		"method":      fullMethod,
		"messageType": string(msg.ProtoReflect().Descriptor().FullName()),
		"message":     hex.EncodeToString(sum[:]),
	}, nil
}

// clientError turns a fingerprinting error into the error a client sees:
// an *idem.Error as it is; anything else (a request that is not a proto
// message: the server's configuration) is internal.
func clientError(err error) error {
	var ie *idem.Error
	if errors.As(err, &ie) {
		return err
	}
	return fmt.Errorf("idemgrpc: fingerprint: %w", err)
}

// KeyFromMetadata reads the idempotency key of a call: exactly one
// idempotency-key value, bare or an RFC 8941 sf-string (idemhttp.ParseKey).
// It answers *idem.Error IDEMPOTENCY_KEY_MISSING without the key and
// IDEMPOTENCY_KEY_INVALID for several values or a malformed one.
func KeyFromMetadata(md metadata.MD) (string, error) {
	vals := md.Get(MetadataKey)
	if len(vals) == 0 {
		return "", idem.Errorf(idem.ECodeKeyMissing, "The idempotency-key metadata is required.")
	}
	if len(vals) != 1 {
		return "", errKeyInvalid()
	}
	key, ok := idemhttp.ParseKey(vals[0])
	if !ok {
		return "", errKeyInvalid()
	}
	return key, nil
}

func errKeyInvalid() error {
	return idem.Errorf(idem.ECodeKeyInvalid, "The idempotency-key metadata must be one key of 1 to 255 visible ASCII characters, bare or as a quoted string.")
}

// Stream returns a stream server interceptor that refuses what the
// contract cannot cover: a stream whose method Options.Methods names, or
// that carries an idempotency key, answers UNIMPLEMENTED
// METHOD_NOT_ALLOWED and its handler is not called. Other streams pass
// through.
func (ic *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		_, named := ic.opts.Methods[info.FullMethod]
		md, _ := metadata.FromIncomingContext(ss.Context())
		if named || len(md.Get(MetadataKey)) > 0 {
			ic.mu.Lock()
			op := ic.ops[info.FullMethod]
			ic.mu.Unlock()
			if op != nil && op.count != nil {
				op.count(idem.LabelRejected)
			}
			st, _ := codeStatus(ic.opts.Errors, idem.ECodeMethodNotAllowed,
				"Idempotency keys are not supported on streaming methods: a stream's answer cannot be stored and replayed.")
			return st.Err()
		}
		return handler(srv, ss)
	}
}

// metadataCarrier reads W3C trace context from incoming metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string { return slices.Collect(maps.Keys(c)) }

// hasUnknown reports whether m or a message it holds has unknown fields.
func hasUnknown(m protoreflect.Message) bool {
	if len(m.GetUnknown()) > 0 {
		return true
	}
	found := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					found = hasUnknown(mv.Message())
					return !found
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				l := v.List()
				for i := 0; i < l.Len() && !found; i++ {
					found = hasUnknown(l.Get(i).Message())
				}
			}
		case fd.Message() != nil:
			found = hasUnknown(v.Message())
		}
		return !found
	})
	return found
}

// discardUnknown drops the unknown fields of m and of every message it
// holds.
func discardUnknown(m protoreflect.Message) {
	if m.GetUnknown() != nil {
		m.SetUnknown(nil)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					discardUnknown(mv.Message())
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					discardUnknown(l.Get(i).Message())
				}
			}
		case fd.Message() != nil:
			discardUnknown(v.Message())
		}
		return true
	})
}
