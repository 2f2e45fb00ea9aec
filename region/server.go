package region

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/routing"
	"github.com/idemcoord/idem/store"
)

// Defaults of Config.
const (
	DefaultAddr         = "127.0.0.1:8080"
	DefaultMaxBodyBytes = 64 << 10
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
	// MaxBodyBytes bounds request bodies; larger ones get 413. Default 64 KiB.
	MaxBodyBytes int64
	// Logger receives request failures. Default: discard.
	Logger *slog.Logger
	// Registry receives the node's metrics and serves /metrics. Default: a
	// new registry.
	Registry *prometheus.Registry
	// Router decides which tenants this node serves and forwards the rest
	// to their home region. Nil serves every tenant here (single region).
	Router *routing.Router
	// NodeID names the node in Idem-Forwarded-By. Default: Region.
	NodeID string
	// Listener, if set, is served instead of listening on Addr.
	Listener net.Listener
}

// Server is a regional node's HTTP server. Create it with NewServer, start it
// with Open, stop it with Close.
type Server struct {
	cfg      Config
	store    *store.Store
	payments *payments.Service
	metrics  *metrics
	logger   *slog.Logger
	handler  http.Handler

	ln   net.Listener
	http *http.Server
	done chan error

	// tokens are the SHA-256 digests of Config.Tokens with their tenants.
	tokens []tokenDigest

	forwardTransport http.RoundTripper
	workerMetrics    *workerMetrics
	workers          workerGroup
	stopWorkers      context.CancelFunc
}

// NewServer returns a Server over st and the payment service pay.
func NewServer(cfg Config, st *store.Store, pay *payments.Service) (*Server, error) {
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
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.NodeID == "" {
		cfg.NodeID = cfg.Region
	}
	m, err := newMetrics(cfg.Registry, st)
	if err != nil {
		return nil, fmt.Errorf("region: register metrics: %w", err)
	}
	wm, err := newWorkerMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("region: register metrics: %w", err)
	}
	s := &Server{cfg: cfg, store: st, payments: pay, metrics: m, workerMetrics: wm, logger: cfg.Logger,
		forwardTransport: http.DefaultTransport.(*http.Transport).Clone()}
	for token, tenant := range cfg.Tokens {
		s.tokens = append(s.tokens, tokenDigest{sum: sha256.Sum256([]byte(token)), tenant: tenant})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", s.authenticated(s.handleCreatePayment))
	mux.HandleFunc("GET /payments/{id}", s.authenticated(s.handleGetPayment))
	mux.HandleFunc("GET /v1/idempotency/records/{operation}/{key}", s.authenticated(s.handleGetRecord))
	s.registerCoordination(mux)
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "region": cfg.Region})
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	for _, p := range []string{"/payments", "/payments/{id}", "/v1/idempotency/records/{operation}/{key}", "/metrics", "/healthz", "/readyz"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, r, s.logger, idem.Errorf(idem.ECodeMethodNotAllowed, "Method %s is not allowed here.", r.Method))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, s.logger, idem.Errorf(idem.ECodeNotFound, "No such endpoint."))
	})
	s.handler = s.instrument(mux)
	return s, nil
}

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
	s.http = &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	s.done = make(chan error, 1)
	go func() { s.done <- s.http.Serve(ln) }()
	return nil
}

// URL returns the base URL the server listens on (after Open).
func (s *Server) URL() string {
	if s.ln == nil {
		return ""
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
	if s.http == nil {
		return nil
	}
	err := s.http.Shutdown(ctx)
	if serveErr := <-s.done; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err
}

type tenantHandler func(w http.ResponseWriter, r *http.Request, tenant string)

// tokenDigest is a bearer token's SHA-256 digest and its tenant.
type tokenDigest struct {
	sum    [sha256.Size]byte
	tenant string
}

// tenantOf returns the tenant of a bearer token, or "". It compares the
// token's SHA-256 digest with every configured token's in constant time:
// digests have one length, so neither a token's content nor its length
// shows in the time taken.
func (s *Server) tenantOf(token string) string {
	sum := sha256.Sum256([]byte(token))
	tenant := ""
	for _, t := range s.tokens {
		if subtle.ConstantTimeCompare(t.sum[:], sum[:]) == 1 {
			tenant = t.tenant
		}
	}
	return tenant
}

// authenticated resolves the bearer token to a tenant, or answers 401 before
// anything else happens (no record is ever written for an unauthenticated
// request).
func (s *Server) authenticated(h tenantHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		tenant := ""
		if ok && token != "" {
			tenant = s.tenantOf(token)
		}
		if tenant == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem"`)
			writeError(w, r, s.logger, idem.Errorf(idem.ECodeUnauthenticated, "A valid bearer token is required."))
			return
		}
		s.routed(h)(w, r, tenant)
	}
}

func (s *Server) handleCreatePayment(w http.ResponseWriter, r *http.Request, tenant string) {
	start := time.Now()
	key, keyPresent := r.Header["Idempotency-Key"]
	switch {
	case !keyPresent:
		writeError(w, r, s.logger, idem.Errorf(idem.ECodeKeyMissing, "The Idempotency-Key header is required."))
		return
	case len(key) != 1 || !idem.ValidKey(key[0]):
		writeError(w, r, s.logger, idem.Errorf(idem.ECodeKeyInvalid, "The Idempotency-Key header must be 1 to 255 visible ASCII characters."))
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, r, s.logger, idem.Errorf(idem.ECodeUnsupportedMediaType, "The body must be application/json."))
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, r, s.logger, idem.Errorf(idem.ECodeBodyTooLarge, "The body is larger than %d bytes.", s.cfg.MaxBodyBytes))
			return
		}
		writeError(w, r, s.logger, &idem.Error{Code: idem.ECodeRequestMalformed, Message: "The body could not be read.", Err: err})
		return
	}
	res, err := s.payments.Create(r.Context(), payments.Request{
		Tenant: tenant, Key: key[0], Body: body, APIVersion: r.Header.Get("Api-Version"), Wait: preferWait(r.Header),
		Uncertain: routeOf(r.Context()).Uncertain,
	})
	s.observe(payments.Operation, res, err, time.Since(start))
	window := strconv.FormatInt(int64(s.payments.Window()/time.Second), 10)
	w.Header().Set("Idempotency-Window", window)
	if err != nil {
		writeError(w, r, s.logger, err)
		return
	}
	for k, v := range res.Response.Headers {
		w.Header().Set(k, v)
	}
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(res.Response.Status)
	_, _ = w.Write(res.Response.Body)
}

// Fenced counts a write or provider call of this node that was rejected
// because a newer owner held the record (idempotency_fenced_total).
func (s *Server) Fenced() { s.metrics.fenced.Inc() }

// observe counts an idempotent request's outcome.
func (s *Server) observe(operation string, res payments.Result, err error, d time.Duration) {
	outcome := res.Outcome.String()
	switch idem.ErrorCode(err) {
	case "":
	case idem.ECodeKeyReused:
		outcome = idem.OutcomeConflict.String()
		s.metrics.conflicts.WithLabelValues(operation).Inc()
	case idem.ECodeInProgress:
		outcome = idem.OutcomeInProgress.String()
		s.metrics.inProgress.WithLabelValues(operation).Inc()
	default:
		if res.Outcome == 0 {
			outcome = "rejected"
		}
	}
	if res.Replayed {
		s.metrics.replays.WithLabelValues(operation).Inc()
	}
	if res.ExpiredRetry {
		s.metrics.expiredRetries.WithLabelValues(operation).Inc()
	}
	if res.Unknown {
		s.metrics.unknownStates.WithLabelValues(operation).Inc()
	}
	s.metrics.requests.WithLabelValues(operation, outcome).Inc()
	s.metrics.latency.WithLabelValues(operation, outcome).Observe(d.Seconds())
}

// preferWait reads Prefer: wait=N (RFC 7240) and returns N seconds, or 0.
func preferWait(h http.Header) time.Duration {
	for _, v := range h.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, val, ok := strings.Cut(strings.TrimSpace(pref), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(val), `"`))
			if err == nil && n > 0 {
				return min(time.Duration(n)*time.Second, payments.MaxWait)
			}
		}
	}
	return 0
}

func (s *Server) handleGetPayment(w http.ResponseWriter, r *http.Request, tenant string) {
	body, err := s.payments.Get(r.Context(), tenant, r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.logger, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// recordView is the inspection view of a record. It never includes the
// stored response body (sensitive data).
type recordView struct {
	Operation             string     `json:"operation"`
	Key                   string     `json:"key"`
	Status                string     `json:"status"`
	Checkpoint            string     `json:"checkpoint"`
	RequestHash           string     `json:"requestHash"`
	HashVersion           int        `json:"hashVersion"`
	Owner                 string     `json:"owner"`
	FencingToken          int64      `json:"fencingToken"`
	LockedUntil           *time.Time `json:"lockedUntil,omitempty"`
	Attempts              int        `json:"attempts"`
	Generation            int        `json:"generation"`
	ResponseStatus        int        `json:"responseStatus,omitempty"`
	ResponseSchemaVersion string     `json:"responseSchemaVersion,omitempty"`
	ResourceType          string     `json:"resourceType,omitempty"`
	ResourceID            string     `json:"resourceId,omitempty"`
	ErrorCode             string     `json:"errorCode,omitempty"`
	HomeRegion            string     `json:"homeRegion"`
	CreatedAt             time.Time  `json:"createdAt"`
	UpdatedAt             time.Time  `json:"updatedAt"`
	ExpiresAt             time.Time  `json:"expiresAt"`
}

func viewOf(rec *idem.Record) recordView {
	v := recordView{
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
	rec, err := s.store.Get(r.Context(), idem.Scope{Tenant: tenant, Operation: r.PathValue("operation"), Key: r.PathValue("key")})
	if err != nil {
		writeError(w, r, s.logger, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(rec))
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		writeError(w, r, s.logger, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "region": s.cfg.Region})
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
