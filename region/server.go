package region

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordapi"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/idemprom"
	"github.com/idemcoord/idem/internal/ident"
	"github.com/idemcoord/idem/internal/telemetry"
	"github.com/idemcoord/idem/internal/tlsutil"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/store"
)

// Defaults of Config.
const (
	DefaultAddr              = "127.0.0.1:8080"
	DefaultMaxBodyBytes      = 64 << 10
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
)

// Config configures a Server.
type Config struct {
	// Addr is the listen address. Default DefaultAddr; ":0" picks a port.
	Addr string
	// Region names the node's region. Default "local".
	Region string
	// Tokens maps bearer tokens to tenants. A request's tenant comes only from
	// its token.
	Tokens map[string]string
	// AdminTokens maps the admin API's bearer tokens to the principals they
	// authenticate (an operator's name, recorded as who settled a record).
	// A tenant's token is never one: NewServer refuses a token in both.
	// Default: none, and the admin API (/v1/admin/records) answers 401.
	AdminTokens map[string]string
	// MaxBodyBytes bounds request bodies; larger ones get 413. Default 64 KiB.
	MaxBodyBytes int64
	// Logger receives request failures. Default: discard.
	Logger *slog.Logger
	// Registry receives the node's metrics, the standard Go runtime,
	// process and build-info collectors and the store pool's statistics,
	// and serves /metrics; it must not hold them already. Default: a new
	// registry.
	Registry *prometheus.Registry
	// MetricsToken, if set, is the bearer token GET /metrics requires
	// (Prometheus: authorization.credentials_file); any other request gets
	// 401 UNAUTHENTICATED. Default: /metrics is open.
	MetricsToken string
	// Router decides which tenants this node serves and forwards the rest
	// to their home region. Nil serves every tenant here (single region).
	Router *routing.Router
	// NodeID names the node in Idem-Forwarded-By. Default: Region.
	NodeID string
	// Listener, if set, is served instead of listening on Addr.
	Listener net.Listener
	// TLS, if set, makes Open serve HTTPS with it (see tlsutil.ServerConfig).
	// Default: plain HTTP.
	TLS *tls.Config
	// PeerCAs, if set, authenticates nodes by certificate: a request
	// forwarded by a node is accepted with a client certificate it
	// verifies that names a node (routing.PeerOf), and this node forwards
	// only over HTTPS, to a node whose certificate it verifies and which
	// names the node looked up. Default: nil (no mTLS between nodes).
	PeerCAs *tlsutil.Pool
	// PeerCert is the certificate this node presents to the nodes it
	// forwards to (with PeerCAs).
	PeerCert *tlsutil.Reloader
	// PeerSecret, if set, authenticates nodes without mTLS: forwarded
	// requests carry it (Idem-Peer-Secret, compared in constant time), over
	// HTTP or over HTTPS verified against the system's roots. With neither
	// PeerCAs nor PeerSecret the node refuses forwarded requests and cannot
	// forward.
	PeerSecret []byte
	// Operations are the operations the coordination API serves, besides
	// the node's own (NewServer's list, which it never serves there). A
	// request for any other operation is refused with 404
	// OPERATION_UNKNOWN before anything is stored or counted. Default:
	// none.
	Operations []string
	// Sidecar makes routes of an existing HTTP service idempotent (see
	// SidecarConfig). Default: none.
	Sidecar SidecarConfig

	// ReadHeaderTimeout bounds reading a request's headers. Default
	// DefaultReadHeaderTimeout (5s).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a request's body, from the moment its
	// handler starts; a body still arriving then is answered 408
	// REQUEST_TIMEOUT and the connection is closed. Default
	// DefaultReadTimeout (30s).
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from the end of its headers to the end
	// of its answer (body read and processing included). A request with
	// Prefer: wait=N gets ReadTimeout + N more, so a legitimate wait is never
	// cut. Default DefaultWriteTimeout (60s).
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request for this
	// long. Default DefaultIdleTimeout (120s).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's header block; larger ones get 431.
	// Default DefaultMaxHeaderBytes (64 KiB).
	MaxHeaderBytes int

	// TracerProvider, if set, traces requests (continuing a caller's W3C
	// traceparent), forwards (the home node continues the same trace), the
	// store's transactions and statements, provider calls and the recovery
	// and cleanup passes. Default: nil, tracing off at no cost. The caller
	// owns it (and shuts it down).
	TracerProvider trace.TracerProvider

	// Engine is the node's engine: the Engine part of each of the node's
	// operations is registered in it, and the recovery worker runs its
	// RecoverStale. A node whose operations fence recovery through etcd
	// passes an engine with that Locker (idemd does). Default: an engine
	// over the store without external fencing.
	Engine *engine.Engine
	// AnswerCacheBytes sizes the answer cache of the engine NewServer
	// makes when Engine is nil (engine.AnswerCache.Bytes; its metrics go
	// to Registry): settled answers replayed from memory. An Engine passed
	// in has its own. Default 0: off.
	AnswerCacheBytes int64
}

// Server is a regional node's HTTP server. Create it with NewServer, start it
// with Open, stop it with Close.
type Server struct {
	cfg Config
	// ops are the node's own operations; routeOps names the operation of
	// each of their route patterns.
	ops      []Operation
	routeOps map[string]string
	store    *store.Store
	engine   *engine.Engine
	metrics  *metrics
	logger   *slog.Logger
	handler  http.Handler
	// routes are the endpoints' patterns, see Routes.
	routes []string
	// operations are the coordination operations served (Config.Operations).
	operations map[string]bool
	// own are the node's own operations (NewServer's list), by name.
	own map[string]Operation
	// window is the replay window of the coordination API's records.
	window time.Duration

	ln   net.Listener
	http *http.Server
	done chan error

	// tokens are the SHA-256 digests of Config.Tokens with their tenants,
	// adminTokens those of Config.AdminTokens with their principals.
	tokens, adminTokens []tokenDigest
	// settled counts the records settled through the admin API
	// (idem_records_settled_total).
	settled *prometheus.CounterVec

	forwardTransport *http.Transport
	peers            peerTransports
	workerMetrics    *workerMetrics
	obs              *observability
	workers          workerGroup
	stopWorkers      context.CancelFunc
	// errors is the node's one table of error codes (nodeErrors).
	errors *idemhttp.Errors
}

// NewServer returns a Server over st serving ops, the node's own operations
// (payments/paymentsnode.Operation for the reference one), besides the coordination API.
func NewServer(cfg Config, st *store.Store, ops ...Operation) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.Region == "" {
		cfg.Region = "local"
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Logger = slog.New(telemetry.NewLogHandler(cfg.Logger.Handler()))
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.NodeID == "" {
		cfg.NodeID = cfg.Region
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout}, {&cfg.ReadTimeout, DefaultReadTimeout},
		{&cfg.WriteTimeout, DefaultWriteTimeout}, {&cfg.IdleTimeout, DefaultIdleTimeout},
	} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	for token, tenant := range cfg.Tokens {
		if token == "" || ident.CheckTenant(tenant) != nil {
			// Never the token itself in the message: it is a secret.
			return nil, fmt.Errorf("region: Config.Tokens: a token is empty or maps to an invalid tenant name (1 to %d characters, no white space, ',' or '=')", ident.MaxTenantLen)
		}
	}
	if cfg.Engine == nil {
		opts := engine.Options{Owner: cfg.NodeID, HomeRegion: cfg.Region, Logger: cfg.Logger,
			AnswerCache: engine.AnswerCache{Bytes: cfg.AnswerCacheBytes}}
		if cfg.AnswerCacheBytes > 0 {
			m, err := idemprom.NewAnswerCache(cfg.Registry)
			if err != nil {
				return nil, fmt.Errorf("region: %w", err)
			}
			opts.AnswerCache.Metrics = m
		}
		cfg.Engine = engine.New(st, opts)
	}
	own := map[string]Operation{}
	var ownNames []string
	window := engine.DefaultWindow
	for _, op := range ops {
		if !idem.ValidOperation(op.Name) {
			return nil, fmt.Errorf("region: the node's operation %q: want 1 to %d characters of a-z, 0-9, '_', '.' and '-'", op.Name, idem.MaxOperationLen)
		}
		if _, dup := own[op.Name]; dup {
			return nil, fmt.Errorf("region: the node's operation %q is listed twice", op.Name)
		}
		own[op.Name] = op
		ownNames = append(ownNames, op.Name)
		if op.Engine != nil {
			if op.Engine.Name != op.Name {
				return nil, fmt.Errorf("region: operation %q registers engine operation %q", op.Name, op.Engine.Name)
			}
			// An engine that runs the operation already (the operation's
			// own service made it, and the node shares it) is used as it is.
			if _, registered := cfg.Engine.Operation(op.Name); !registered {
				if err := cfg.Engine.Register(*op.Engine); err != nil {
					return nil, fmt.Errorf("region: %w", err)
				}
			}
			if len(own) == 1 && op.Engine.Window > 0 {
				window = op.Engine.Window
			}
		}
	}
	coordOps := map[string]bool{}
	for _, op := range cfg.Operations {
		if _, mine := own[op]; !idem.ValidOperation(op) || mine {
			return nil, fmt.Errorf("region: operation %q: want 1 to %d characters of a-z, 0-9, '_', '.' and '-', and not one of the node's own (%s)", op, idem.MaxOperationLen, strings.Join(ownNames, ", "))
		}
		coordOps[op] = true
	}
	m, err := newMetrics(cfg.Registry, st, append(ownNames, slices.Sorted(maps.Keys(coordOps))...))
	if err != nil {
		return nil, fmt.Errorf("region: register metrics: %w", err)
	}
	wm, err := newWorkerMetrics(cfg.Registry, ops)
	if err != nil {
		return nil, fmt.Errorf("region: register metrics: %w", err)
	}
	obs, err := newObservability(cfg, st, cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("region: register metrics: %w", err)
	}
	for _, op := range ops {
		for _, c := range op.Collectors {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("region: register operation %q's metrics: %w", op.Name, err)
			}
		}
	}
	s := &Server{cfg: cfg, store: st, engine: cfg.Engine, metrics: m, workerMetrics: wm, obs: obs, logger: cfg.Logger, operations: coordOps, own: own, window: window,
		forwardTransport: newPeerTransport(), ops: ops, routeOps: map[string]string{}}
	if s.errors, err = nodeErrors(ops); err != nil {
		return nil, err
	}
	for token, tenant := range cfg.Tokens {
		s.tokens = append(s.tokens, tokenDigest{sum: sha256.Sum256([]byte(token)), name: tenant})
	}
	if s.adminTokens, err = adminDigests(cfg.AdminTokens, cfg.Tokens); err != nil {
		return nil, err
	}
	if s.settled, err = newSettledMetric(cfg.Registry); err != nil {
		return nil, fmt.Errorf("region: register metrics: %w", err)
	}
	mux := &routeMux{ServeMux: http.NewServeMux()}
	var paths []string
	for _, op := range ops {
		if op.Routes == nil {
			continue
		}
		for _, rt := range op.Routes(s) {
			mux.HandleFunc(rt.Pattern, s.authenticated(rt.Handler))
			s.routeOps[rt.Pattern] = op.Name
			if _, path, ok := strings.Cut(rt.Pattern, " "); ok && !slices.Contains(paths, path) {
				paths = append(paths, path)
			}
		}
	}
	mux.HandleFunc("GET /v1/idempotency/records/{operation}/{key}", s.authenticated(s.handleGetRecord))
	s.registerCoordination(mux)
	s.registerAdmin(mux)
	// A collector that fails (the store's gauge while the store is down)
	// leaves its series out and is logged; the scrape still serves every
	// other series, which the alerts on the outage itself read.
	mux.Handle("GET /metrics", s.metricsAuth(promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, ErrorLog: scrapeErrorLog{s.logger}})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "region": cfg.Region})
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	// After every endpoint of the node's own, which no route may overlap.
	if err := s.registerSidecar(mux); err != nil {
		return nil, err
	}
	for _, p := range append(paths, "/v1/idempotency/records/{operation}/{key}", "/metrics", "/healthz", "/readyz") {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			s.writeError(w, r, idem.Errorf(idem.ECodeMethodNotAllowed, "The method is not allowed here."))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, idem.Errorf(idem.ECodeNotFound, "No such endpoint."))
	})
	s.routes = mux.patterns
	s.handler = s.observed(s.deadlines(s.instrument(s.declaredBodyLimit(mux))))
	return s, nil
}

// routeMux is the node's mux, keeping the patterns of its endpoints (those
// naming a method; the method-less ones only answer 405 or 404).
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	if strings.Contains(pattern, " ") {
		m.patterns = append(m.patterns, pattern)
	}
	m.ServeMux.Handle(pattern, h)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// Routes lists the patterns ("METHOD /path") of the endpoints the node
// serves, proxied routes included, in the order they were registered.
// docs/openapi.yaml documents each of them (a test checks it).
func (s *Server) Routes() []string { return slices.Clone(s.routes) }

// Handler returns the node's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Open starts listening on Config.Addr (or serves Config.Listener) and
// serving in the background.
func (s *Server) Open() error {
	ln := s.cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.cfg.Addr); err != nil {
			return fmt.Errorf("region: listen: %w", err)
		}
	}
	s.ln = ln
	s.http = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		// The body's own deadline is set per request (deadlines), so that
		// it never cuts a request that has read its body and is waiting.
		WriteTimeout:   s.cfg.WriteTimeout,
		IdleTimeout:    s.cfg.IdleTimeout,
		MaxHeaderBytes: s.cfg.MaxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(s.logger.Handler(), slog.LevelDebug),
	}
	s.done = make(chan error, 1)
	if s.cfg.TLS != nil {
		s.http.TLSConfig = s.cfg.TLS
		go func() { s.done <- s.http.ServeTLS(ln, "", "") }()
		return nil
	}
	go func() { s.done <- s.http.Serve(ln) }()
	return nil
}

// URL returns the base URL the server listens on (after Open).
func (s *Server) URL() string {
	if s.ln == nil {
		return ""
	}
	if s.cfg.TLS != nil {
		return "https://" + s.ln.Addr().String()
	}
	return "http://" + s.ln.Addr().String()
}

// Close stops accepting requests and waits, until ctx is done, for running
// ones to finish.
func (s *Server) Close(ctx context.Context) error {
	if s.stopWorkers != nil {
		s.stopWorkers()
	}
	defer s.workers.Wait()
	defer s.peers.closeIdle()
	defer s.forwardTransport.CloseIdleConnections()
	if s.http == nil {
		return nil
	}
	err := s.http.Shutdown(ctx)
	if serveErr := <-s.done; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err
}

type tenantHandler = TenantHandler

// tokenDigest is a bearer token's SHA-256 digest and the name it
// authenticates (a tenant, or an admin principal).
type tokenDigest struct {
	sum  [sha256.Size]byte
	name string
}

// tenantOf returns the tenant of a bearer token, or "".
func (s *Server) tenantOf(token string) string { return nameOf(s.tokens, token) }

// nameOf returns the name of a bearer token among digests, or "". It
// compares the token's SHA-256 digest with every digest in constant time:
// digests have one length, so neither a token's content nor its length
// shows in the time taken.
func nameOf(digests []tokenDigest, token string) string {
	sum := sha256.Sum256([]byte(token))
	name := ""
	for _, t := range digests {
		if subtle.ConstantTimeCompare(t.sum[:], sum[:]) == 1 {
			name = t.name
		}
	}
	return name
}

// metricsAuth guards /metrics with Config.MetricsToken, compared in
// constant time over digests as tenant tokens are.
func (s *Server) metricsAuth(h http.Handler) http.Handler {
	if s.cfg.MetricsToken == "" {
		return h
	}
	want := sha256.Sum256([]byte(s.cfg.MetricsToken))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		got := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem-metrics"`)
			s.writeError(w, r, idem.Errorf(idem.ECodeUnauthenticated, "A valid bearer token is required."))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// authenticated resolves the bearer token to a tenant, or answers 401 before
// anything else happens (no record is ever written for an unauthenticated
// request). A request carrying Idem-Forwarded-By is a forwarded one: its
// tenant is the one an authenticated peer states, and anything else is
// refused with 403 FORWARDING_NOT_AUTHENTICATED.
func (s *Server) authenticated(h tenantHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Header[HeaderForwardedBy]; ok {
			tenant, hops, err := s.forwarded(r)
			if err != nil {
				s.writeError(w, r, err)
				return
			}
			s.routed(h, hops)(w, r, tenant)
			return
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		tenant := ""
		if ok && token != "" {
			tenant = s.tenantOf(token)
		}
		if tenant == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem"`)
			s.writeError(w, r, idem.Errorf(idem.ECodeUnauthenticated, "A valid bearer token is required."))
			return
		}
		s.routed(h, 0)(w, r, tenant)
	}
}

// scrapeErrorLog logs what a scrape of /metrics could not collect.
type scrapeErrorLog struct{ logger *slog.Logger }

func (l scrapeErrorLog) Println(v ...any) {
	l.logger.Warn("metrics scrape incomplete", "err", fmt.Sprint(v...))
}

// Fenced counts a write or provider call of this node that was rejected
// because a newer owner held the record (idempotency_fenced_total).
func (s *Server) Fenced() { s.metrics.fenced.Inc() }

// viewOf is the inspection view of rec (coordapi.Record): never the stored
// response body (sensitive data).
func viewOf(rec *idem.Record) *coordapi.Record {
	v := &coordapi.Record{
		Operation: rec.Operation, Key: rec.Key, Status: string(rec.Status), Checkpoint: string(rec.Checkpoint),
		RequestHash: rec.RequestHash, HashVersion: rec.HashVersion, Owner: rec.Owner, FencingToken: rec.FencingToken,
		LockedUntil: rec.LockedUntil, Attempts: rec.Attempts, Generation: rec.Generation,
		ResourceType: rec.ResourceType, ResourceID: rec.ResourceID, ErrorCode: rec.ErrorCode, HomeRegion: rec.HomeRegion,
		CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt, ExpiresAt: rec.ExpiresAt,
	}
	if rec.Response != nil {
		v.ResponseStatus, v.ResponseSchemaVersion = rec.Response.Status, rec.Response.SchemaVersion
	}
	return v
}

// handleGetRecord shows the caller's own record. Another tenant's key is
// indistinguishable from an absent one.
func (s *Server) handleGetRecord(w http.ResponseWriter, r *http.Request, tenant string) {
	op, key := r.PathValue("operation"), r.PathValue("key")
	switch {
	case !idem.ValidKey(key):
		s.writeError(w, r, idem.Errorf(idem.ECodeKeyInvalid, "An idempotency key is 1 to 255 visible ASCII characters."))
		return
	case !idem.ValidOperation(op):
		s.writeError(w, r, idem.Errorf(idem.ECodeValidationFailed, "An operation name is 1 to %d characters of a-z, 0-9, '_', '.' and '-'.", idem.MaxOperationLen))
		return
	}
	rec, err := s.store.Get(r.Context(), idem.Scope{Tenant: tenant, Operation: op, Key: key})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(rec))
}

// handleReady is the readiness probe: 200 when the store answers and, with
// routing, the node's region holds its lease and its map has caught up
// (routing.Router.Ready); otherwise 503 with the error's code.
func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.cfg.Router != nil {
		if err := s.cfg.Router.Ready(); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "region": s.cfg.Region})
}

// readBody reads a request body of at most MaxBodyBytes: 413 when larger,
// 408 when it does not arrive within ReadTimeout, 422 when it cannot be read.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err == nil {
		return body, nil
	}
	var (
		tooLarge *http.MaxBytesError
		e        *idem.Error
	)
	switch {
	case errors.As(err, &tooLarge):
		return nil, idem.Errorf(idem.ECodeBodyTooLarge, "The body is larger than %d bytes.", s.cfg.MaxBodyBytes)
	case errors.As(err, &e):
		return nil, e
	}
	return nil, &idem.Error{Code: idem.ECodeRequestMalformed, Message: "The body could not be read.", Err: err}
}

// deadlines gives each request with a body a read deadline, ReadTimeout
// from the handler's start (net/http lifts it once the body has been read,
// for its background read), and moves the write deadline of a request that
// states a wait above 0 (idemhttp.PreferWait, capped at the node's
// operations' MaxWait, engine.DefaultMaxWait) to ReadTimeout + the wait +
// WriteTimeout from the handler's start. A route's default wait moves
// nothing: it is below WriteTimeout (registerSidecar).
func (s *Server) deadlines(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		now := time.Now()
		if wait, _ := idemhttp.PreferWait(r.Header, engine.DefaultMaxWait); wait > 0 {
			// Unsupported (a test recorder): nothing to extend.
			_ = rc.SetWriteDeadline(now.Add(s.cfg.ReadTimeout + wait + s.cfg.WriteTimeout))
		}
		if r.Body != nil && r.Body != http.NoBody {
			if err := rc.SetReadDeadline(now.Add(s.cfg.ReadTimeout)); err == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody turns a body read past its deadline into 408
// REQUEST_TIMEOUT.
type deadlineBody struct {
	io.ReadCloser
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == nil || b.done {
		return n, err
	}
	b.done = true
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return n, &idem.Error{Code: idem.ECodeRequestTimeout, Message: "The request body did not arrive in time.", Err: err}
	}
	return n, err
}

// statusWriter records the status code for metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (s *Server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		s.metrics.httpDuration.WithLabelValues(route, strconv.Itoa(sw.status)).Observe(time.Since(start).Seconds())
	})
}

// MaxBodyBytes is the bound of request bodies (Config.MaxBodyBytes, or its
// default): an Operation's handlers read their bodies within it.
func (s *Server) MaxBodyBytes() int64 { return s.cfg.MaxBodyBytes }

// Logger is the node's logger, for an Operation's handlers and workers.
func (s *Server) Logger() *slog.Logger { return s.logger }
