package provider

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemcoord/idem/internal/strictjson"
)

// HTTP header names used by the provider API.
const (
	// HeaderIdempotencyKey carries the provider key of a charge.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderFencingToken carries the caller's fencing token (an int64).
	HeaderFencingToken = "Idem-Fencing-Token"
	// HeaderReplayed is "true" on answers that replay an earlier outcome.
	HeaderReplayed = "Idempotent-Replayed"
)

// Error codes of the provider API, found in the errorCode field of error
// bodies and in [APIError.Code].
const (
	CodeKeyMissing          = "PROVIDER_KEY_MISSING"
	CodeKeyInvalid          = "PROVIDER_KEY_INVALID"
	CodeKeyReused           = "PROVIDER_KEY_REUSED"
	CodeFencingTokenInvalid = "FENCING_TOKEN_INVALID"
	CodeFencingTokenStale   = "FENCING_TOKEN_STALE"
	CodeInvalidRequest      = "INVALID_REQUEST"
	CodeInvalidFault        = "INVALID_FAULT"
	CodeUnavailable         = "PROVIDER_UNAVAILABLE"
	CodeDeclined            = "PAYMENT_DECLINED"
	CodeChargeNotFound      = "CHARGE_NOT_FOUND"
	CodeNotFound            = "NOT_FOUND"
	CodeUnauthenticated     = "UNAUTHENTICATED"
)

// ProviderKeyPrefix starts every provider key: provider_payment_<paymentId>.
const ProviderKeyPrefix = "provider_payment_"

// StatusConfirmed is the status of every applied charge.
const StatusConfirmed = "CONFIRMED"

// DefaultSlowDelay is the delay of a slow fault that does not set one.
const DefaultSlowDelay = 5 * time.Second

// shutdownTimeout bounds the graceful shutdown of [Serve].
const shutdownTimeout = 10 * time.Second

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 1 << 20

// maxKeyLen bounds provider keys.
const maxKeyLen = 255

// ProviderKeyFor returns the provider key of a payment:
// "provider_payment_" + paymentID.
func ProviderKeyFor(paymentID string) string { return ProviderKeyPrefix + paymentID }

// ChargeIDFor returns the charge id the simulator assigns to a provider key:
// "ch_" followed by the first 16 hex digits of SHA-256(key). It is
// deterministic, so a key can never map to two charges.
func ChargeIDFor(providerKey string) string {
	sum := sha256.Sum256([]byte(providerKey))
	return "ch_" + hex.EncodeToString(sum[:])[:16]
}

// Charge is an applied charge, as answered by POST /v1/charges and
// GET /v1/charges/{providerKey}.
type Charge struct {
	ChargeID    string    `json:"chargeId"`
	ProviderKey string    `json:"providerKey"`
	Status      string    `json:"status"`
	AmountMinor int64     `json:"amountMinor"`
	Currency    string    `json:"currency"`
	AccountID   string    `json:"accountId,omitempty"`
	CreatedAt   time.Time `json:"createdAt"`
	// Replayed is set by [Client.Charge] when the provider answered with
	// Idempotent-Replayed: true (the key had already charged). It is not
	// part of the JSON body.
	Replayed bool `json:"-"`
}

// ChargeCounts counts charge applications, as answered by GET /admin/charges.
// A key replayed any number of times counts 1; a key that shows 2 was
// charged twice, which the simulator never does unless its log says so.
type ChargeCounts struct {
	Total int            `json:"total"`
	ByKey map[string]int `json:"byKey"`
}

// FaultMode selects how the simulator misbehaves on charge requests.
type FaultMode string

// Fault modes.
const (
	FaultNone       FaultMode = "none"
	FaultFail       FaultMode = "fail"
	FaultDecline    FaultMode = "decline"
	FaultSlow       FaultMode = "slow"
	FaultLoseAnswer FaultMode = "lose-answer"
)

func (m FaultMode) valid() bool {
	switch m {
	case FaultNone, FaultFail, FaultDecline, FaultSlow, FaultLoseAnswer:
		return true
	}
	return false
}

// Fault is the active fault, set with PUT /admin/fault and read with
// GET /admin/fault. Its JSON form is
// {"mode":"slow","times":2,"delay":"2s"}.
type Fault struct {
	// Mode is the failure to inject; "" is read as none.
	Mode FaultMode
	// Times is how many charge requests the fault applies to; 0 means until
	// changed. GET /admin/fault answers the remaining count.
	Times int
	// Delay is how long a slow fault holds each request. It is ignored for
	// other modes; 0 means [DefaultSlowDelay].
	Delay time.Duration
}

type faultJSON struct {
	Mode  FaultMode `json:"mode"`
	Times int       `json:"times"`
	Delay string    `json:"delay,omitempty"`
}

// MarshalJSON encodes the fault with Delay as a Go duration string.
func (f Fault) MarshalJSON() ([]byte, error) {
	w := faultJSON{Mode: f.Mode, Times: f.Times}
	if f.Mode == "" {
		w.Mode = FaultNone
	}
	if f.Delay != 0 {
		w.Delay = f.Delay.String()
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes the fault strictly (package strictjson: exact
// names, each once); delay is a Go duration string like "2s".
func (f *Fault) UnmarshalJSON(b []byte) error {
	var w faultJSON
	if err := strictjson.DecodeObject(b, &w); err != nil {
		return fmt.Errorf("provider: fault: %w", err)
	}
	var d time.Duration
	if w.Delay != "" {
		var err error
		if d, err = time.ParseDuration(w.Delay); err != nil {
			return fmt.Errorf("provider: fault delay: %w", err)
		}
	}
	*f = Fault{Mode: w.Mode, Times: w.Times, Delay: d}
	return nil
}

// normalize validates f and fills defaults.
func (f Fault) normalize() (Fault, error) {
	if f.Mode == "" {
		f.Mode = FaultNone
	}
	if !f.Mode.valid() {
		return Fault{}, fmt.Errorf("unknown fault mode; modes are %s, %s, %s, %s and %s", FaultNone, FaultFail, FaultDecline, FaultSlow, FaultLoseAnswer)
	}
	if f.Times < 0 {
		return Fault{}, fmt.Errorf("times must be >= 0, got %d", f.Times)
	}
	if f.Delay < 0 {
		return Fault{}, fmt.Errorf("delay must be >= 0, got %s", f.Delay)
	}
	switch f.Mode {
	case FaultNone:
		return Fault{Mode: FaultNone}, nil
	case FaultSlow:
		if f.Delay == 0 {
			f.Delay = DefaultSlowDelay
		}
	default:
		f.Delay = 0
	}
	return f, nil
}

// Config configures a [Server].
type Config struct {
	// DataDir is where the simulator persists charges, declines and fencing
	// tokens (file [DataFileName], created if missing). Empty means state
	// is kept in memory only and lost on restart. At most one Server may use
	// a DataDir at a time.
	DataDir string
	// Logger receives operational logs. Nil discards them.
	Logger *slog.Logger
	// APIKey, when set, is required as "Authorization: Bearer <APIKey>" on
	// the charge endpoints (/v1/...). Empty leaves them open, which only
	// in-process tests should do; idemctl provider requires a key.
	APIKey string
	// AdminKey, when set, is required the same way on the /admin endpoints
	// (faults, charge counts), which the payment service never calls. It
	// should differ from APIKey. Empty leaves them open.
	AdminKey string
}

// Server is the payment provider simulator. Create it with [NewServer],
// mount [Server.Handler] on an HTTP server, and [Server.Close] it when done.
// Faults are not persisted: a new Server starts with none.
type Server struct {
	log   *slog.Logger
	store *store
	mux   *http.ServeMux

	faultMu sync.Mutex
	fault   Fault

	// Charges whose client went away during a slow fault are finished in
	// the background; bgCtx is cancelled by Close, which waits for them.
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bgMu     sync.Mutex
	bgClosed bool
	bg       sync.WaitGroup
}

// NewServer loads the persisted state from cfg.DataDir, if any, and returns a
// Server with no active fault.
func NewServer(cfg Config) (*Server, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st, err := openStore(cfg.DataDir, log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		log:      log,
		store:    st,
		mux:      http.NewServeMux(),
		fault:    Fault{Mode: FaultNone},
		bgCtx:    ctx,
		bgCancel: cancel,
	}
	api, admin := requireKey(cfg.APIKey), requireKey(cfg.AdminKey)
	s.mux.HandleFunc("POST /v1/charges", api(s.handleCharge))
	s.mux.HandleFunc("GET /v1/charges/{providerKey}", api(s.handleLookup))
	s.mux.HandleFunc("PUT /admin/fault", admin(s.handleSetFault))
	s.mux.HandleFunc("GET /admin/fault", admin(s.handleGetFault))
	s.mux.HandleFunc("GET /admin/charges", admin(s.handleCounts))
	s.mux.HandleFunc("GET /healthz", s.handleHealth)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, CodeNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	return s, nil
}

// requireKey returns a middleware that answers 401 UNAUTHENTICATED unless
// the request carries "Authorization: Bearer <key>"; with an empty key it
// lets every request through. The SHA-256 digests of the two keys are
// compared in constant time, so neither the content nor the length of the
// key leaks through timing.
func requireKey(key string) func(http.HandlerFunc) http.HandlerFunc {
	if key == "" {
		return func(h http.HandlerFunc) http.HandlerFunc { return h }
	}
	want := sha256.Sum256([]byte(key))
	return func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			sum := sha256.Sum256([]byte(got))
			if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", "Bearer")
				writeError(w, http.StatusUnauthorized, CodeUnauthenticated, "a valid bearer key is required")
				return
			}
			h(w, r)
		}
	}
}

// Handler returns the HTTP handler of the simulator.
func (s *Server) Handler() http.Handler { return s.mux }

// Close abandons charges still waiting in the background for a slow delay
// (like a crash would; their clients never got an answer), waits for them to
// stop, and closes the data file. Requests handled after Close answer 503.
// Close is safe to call more than once.
func (s *Server) Close() error {
	s.bgMu.Lock()
	s.bgClosed = true
	s.bgMu.Unlock()
	s.bgCancel()
	s.bg.Wait()
	return s.store.close()
}

// Fault returns the active fault.
func (s *Server) Fault() Fault {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return s.fault
}

// SetFault replaces the active fault, after validating it and filling
// defaults (see [Fault]).
func (s *Server) SetFault(f Fault) (Fault, error) {
	f, err := f.normalize()
	if err != nil {
		return Fault{}, fmt.Errorf("provider: %w", err)
	}
	s.faultMu.Lock()
	s.fault = f
	s.faultMu.Unlock()
	s.log.Info("provider: fault set", "mode", f.Mode, "times", f.Times, "delay", f.Delay)
	return f, nil
}

// takeFault consumes one unit of the active fault for a charge request and
// returns the fault that applies to it.
func (s *Server) takeFault() Fault {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	f := s.fault
	if f.Mode != FaultNone && f.Times > 0 {
		s.fault.Times--
		if s.fault.Times == 0 {
			s.fault = Fault{Mode: FaultNone}
		}
	}
	return f
}

type chargeBody struct {
	AmountMinor int64  `json:"amountMinor"`
	Currency    string `json:"currency"`
	AccountID   string `json:"accountId"`
}

func (s *Server) handleCharge(w http.ResponseWriter, r *http.Request) {
	in, ok := parseChargeRequest(w, r)
	if !ok {
		return
	}
	f := s.takeFault()
	switch f.Mode {
	case FaultFail:
		s.log.Info("provider: fault fail", "key", in.Key)
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "the provider is unavailable (injected fault); nothing was charged")
		return
	case FaultSlow:
		if !s.wait(w, r, f.Delay, in) {
			return
		}
	}
	out := s.store.charge(in, f.Mode == FaultDecline, time.Now())
	s.logOutcome(in, out)
	if f.Mode == FaultLoseAnswer {
		s.log.Info("provider: fault lose-answer, dropping connection", "key", in.Key)
		dropConnection(w)
		return
	}
	writeOutcome(w, out)
}

// wait holds a request for a slow fault. It reports whether the handler
// should go on processing. If the client goes away first, the charge is
// handed to a background goroutine that applies it when the delay ends.
func (s *Server) wait(w http.ResponseWriter, r *http.Request, d time.Duration, in chargeInput) bool {
	deadline := time.Now().Add(d)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-s.bgCtx.Done():
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "the provider is shutting down; nothing was charged")
		return false
	case <-r.Context().Done():
		s.finishLater(time.Until(deadline), in)
		return false
	}
}

// finishLater applies a charge after d unless the server closes first.
func (s *Server) finishLater(d time.Duration, in chargeInput) {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return
	}
	s.log.Info("provider: client left during slow fault; charge continues", "key", in.Key, "remaining", d)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
			out := s.store.charge(in, false, time.Now())
			s.logOutcome(in, out)
		case <-s.bgCtx.Done():
			s.log.Warn("provider: server closed; abandoned slow charge", "key", in.Key)
		}
	}()
}

func (s *Server) logOutcome(in chargeInput, out outcome) {
	switch out.kind {
	case outcomeCharged:
		s.log.Info("provider: charged", "key", in.Key, "chargeId", out.charge.ChargeID, "amountMinor", in.AmountMinor, "currency", in.Currency)
	case outcomeDeclined:
		s.log.Info("provider: declined", "key", in.Key)
	case outcomeStoreFailed:
		s.log.Error("provider: charge failed", "key", in.Key, "err", out.err)
	default:
		s.log.Debug("provider: charge request", "key", in.Key, "outcome", int(out.kind))
	}
}

// parseChargeRequest validates a POST /v1/charges request, answering 400 on
// failure.
func parseChargeRequest(w http.ResponseWriter, r *http.Request) (chargeInput, bool) {
	key := r.Header.Get(HeaderIdempotencyKey)
	if key == "" {
		writeError(w, http.StatusBadRequest, CodeKeyMissing, "header "+HeaderIdempotencyKey+" is required")
		return chargeInput{}, false
	}
	if err := validateProviderKey(key); err != nil {
		writeError(w, http.StatusBadRequest, CodeKeyInvalid, err.Error())
		return chargeInput{}, false
	}
	in := chargeInput{Key: key}
	if v := r.Header.Get(HeaderFencingToken); v != "" {
		tok, err := strconv.ParseInt(v, 10, 64)
		if err != nil || tok < 0 {
			writeError(w, http.StatusBadRequest, CodeFencingTokenInvalid, "header "+HeaderFencingToken+" must be a non-negative int64")
			return chargeInput{}, false
		}
		in.Token, in.HasToken = tok, true
	}
	// Read the body to its end: only then does net/http watch the
	// connection and cancel the request context when the client leaves,
	// which a slow fault relies on.
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, fmt.Sprintf("the body could not be read or is larger than %d bytes", maxBodyBytes))
		return chargeInput{}, false
	}
	var body chargeBody
	if err := strictjson.DecodeObject(raw, &body); err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest,
			"the body must be one JSON object of amountMinor, currency and accountId (exact names, each once, valid UTF-8)")
		return chargeInput{}, false
	}
	if body.AmountMinor <= 0 {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, "amountMinor must be positive")
		return chargeInput{}, false
	}
	if !validCurrency(body.Currency) {
		writeError(w, http.StatusBadRequest, CodeInvalidRequest, "currency must be three upper-case letters")
		return chargeInput{}, false
	}
	in.AmountMinor, in.Currency, in.AccountID = body.AmountMinor, body.Currency, body.AccountID
	return in, true
}

// validateProviderKey checks the provider_payment_<paymentId> format, with a
// paymentId of letters, digits and ._:~-.
func validateProviderKey(key string) error {
	if len(key) > maxKeyLen {
		return fmt.Errorf("provider key longer than %d bytes", maxKeyLen)
	}
	id, ok := strings.CutPrefix(key, ProviderKeyPrefix)
	if !ok || id == "" {
		return fmt.Errorf("provider key must look like %s<paymentId>", ProviderKeyPrefix)
	}
	for _, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.ContainsRune("._:~-", c):
		default:
			return fmt.Errorf("provider key contains invalid character %q", c)
		}
	}
	return nil
}

func validCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := range len(c) {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

func writeOutcome(w http.ResponseWriter, out outcome) {
	switch out.kind {
	case outcomeCharged:
		writeJSON(w, http.StatusCreated, out.charge)
	case outcomeReplayed:
		w.Header().Set(HeaderReplayed, "true")
		writeJSON(w, http.StatusOK, out.charge)
	case outcomeDeclined:
		writeError(w, http.StatusPaymentRequired, CodeDeclined, out.decline.Message)
	case outcomeDeclineReplayed:
		w.Header().Set(HeaderReplayed, "true")
		writeError(w, http.StatusPaymentRequired, CodeDeclined, out.decline.Message)
	case outcomeStaleToken:
		writeError(w, http.StatusConflict, CodeFencingTokenStale,
			fmt.Sprintf("fencing token is lower than the highest seen for this key (%d); nothing was charged", out.highest))
	case outcomeKeyReused:
		writeError(w, http.StatusConflict, CodeKeyReused, "the provider key was already used with a different amount or currency")
	default:
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "the provider could not record the charge; nothing was charged")
	}
}

// dropConnection closes the client connection without writing an answer.
func dropConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler) // e.g. HTTP/2: abort the stream instead
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

func (s *Server) handleLookup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("providerKey")
	ch, ok := s.store.lookup(key)
	if !ok {
		writeError(w, http.StatusNotFound, CodeChargeNotFound, "no charge was applied for this provider key")
		return
	}
	writeJSON(w, http.StatusOK, ch)
}

func (s *Server) handleSetFault(w http.ResponseWriter, r *http.Request) {
	var f Fault
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err == nil {
		err = strictjson.DecodeObject(raw, &f)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidFault,
			`the body must be one JSON object {"mode","times","delay"} (exact names, each once, valid UTF-8, delay a Go duration)`)
		return
	}
	f, err = s.SetFault(f)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidFault, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, f)
}

func (s *Server) handleGetFault(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Fault())
}

func (s *Server) handleCounts(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.store.counts())
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// errorBody is the JSON form of every error answer.
type errorBody struct {
	ErrorCode string `json:"errorCode"`
	Message   string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, errorBody{ErrorCode: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"errorCode":"INTERNAL","message":"encoding failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// ListenAndServe listens on addr (for example "127.0.0.1:8090" or ":0") and
// runs the simulator there until ctx is done; see [Serve]. It is what
// `idemctl provider --listen ADDR --data-dir DIR` calls.
func ListenAndServe(ctx context.Context, addr string, cfg Config) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("provider: listen %s: %w", addr, err)
	}
	return Serve(ctx, ln, cfg)
}

// Serve runs the simulator on ln until ctx is done, then shuts down
// gracefully (waiting up to 10s for requests in flight), closes the [Server]
// and returns nil. It returns an error if the state cannot be loaded or the
// HTTP server fails. Serve closes ln.
func Serve(ctx context.Context, ln net.Listener, cfg Config) error {
	srv, err := NewServer(cfg)
	if err != nil {
		_ = ln.Close()
		return err
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(srv.log.Handler(), slog.LevelWarn),
	}
	srv.log.Info("provider: listening", "addr", ln.Addr().String(), "dataDir", cfg.DataDir)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()

	select {
	case err := <-errc:
		return errors.Join(fmt.Errorf("provider: serve: %w", err), srv.Close())
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	var errs []error
	if err := hs.Shutdown(shutdownCtx); err != nil {
		errs = append(errs, fmt.Errorf("provider: shutdown: %w", err))
		_ = hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		errs = append(errs, fmt.Errorf("provider: serve: %w", err))
	}
	if err := srv.Close(); err != nil {
		errs = append(errs, err)
	}
	srv.log.Info("provider: stopped")
	return errors.Join(errs...)
}
