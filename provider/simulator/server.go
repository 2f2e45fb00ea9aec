package simulator

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
	"github.com/idemcoord/idem/provider"
)

// shutdownTimeout bounds the graceful shutdown of [Serve].
const shutdownTimeout = 10 * time.Second

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 1 << 20

// maxKeyLen bounds provider keys.
const maxKeyLen = 255

// ChargeIDFor returns the charge id the simulator assigns to a provider key:
// "ch_" followed by the first 16 hex digits of SHA-256(key). It is
// deterministic, so a key can never map to two charges.
func ChargeIDFor(providerKey string) string {
	sum := sha256.Sum256([]byte(providerKey))
	return "ch_" + hex.EncodeToString(sum[:])[:16]
}

func validMode(m provider.FaultMode) bool {
	switch m {
	case provider.FaultNone, provider.FaultFail, provider.FaultDecline, provider.FaultSlow, provider.FaultLoseAnswer:
		return true
	}
	return false
}

// normalize validates f and fills defaults.
func normalizeFault(f provider.Fault) (provider.Fault, error) {
	if f.Mode == "" {
		f.Mode = provider.FaultNone
	}
	if !validMode(f.Mode) {
		return provider.Fault{}, fmt.Errorf("unknown fault mode; modes are %s, %s, %s, %s and %s", provider.FaultNone, provider.FaultFail, provider.FaultDecline, provider.FaultSlow, provider.FaultLoseAnswer)
	}
	if f.Times < 0 {
		return provider.Fault{}, fmt.Errorf("times must be >= 0, got %d", f.Times)
	}
	if f.Delay < 0 {
		return provider.Fault{}, fmt.Errorf("delay must be >= 0, got %s", f.Delay)
	}
	switch f.Mode {
	case provider.FaultNone:
		return provider.Fault{Mode: provider.FaultNone}, nil
	case provider.FaultSlow:
		if f.Delay == 0 {
			f.Delay = provider.DefaultSlowDelay
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
	fault   provider.Fault

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
		fault:    provider.Fault{Mode: provider.FaultNone},
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
		writeError(w, http.StatusNotFound, provider.CodeNotFound, "no route for "+r.Method+" "+r.URL.Path)
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
				writeError(w, http.StatusUnauthorized, provider.CodeUnauthenticated, "a valid bearer key is required")
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
func (s *Server) Fault() provider.Fault {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return s.fault
}

// SetFault replaces the active fault, after validating it and filling
// defaults (see [provider.Fault]).
func (s *Server) SetFault(f provider.Fault) (provider.Fault, error) {
	f, err := normalizeFault(f)
	if err != nil {
		return provider.Fault{}, fmt.Errorf("provider: %w", err)
	}
	s.faultMu.Lock()
	s.fault = f
	s.faultMu.Unlock()
	s.log.Info("provider: fault set", "mode", f.Mode, "times", f.Times, "delay", f.Delay)
	return f, nil
}

// takeFault consumes one unit of the active fault for a charge request and
// returns the fault that applies to it.
func (s *Server) takeFault() provider.Fault {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	f := s.fault
	if f.Mode != provider.FaultNone && f.Times > 0 {
		s.fault.Times--
		if s.fault.Times == 0 {
			s.fault = provider.Fault{Mode: provider.FaultNone}
		}
	}
	return f
}

func (s *Server) handleCharge(w http.ResponseWriter, r *http.Request) {
	in, ok := parseChargeRequest(w, r)
	if !ok {
		return
	}
	f := s.takeFault()
	switch f.Mode {
	case provider.FaultFail:
		s.log.Info("provider: fault fail", "key", in.Key)
		writeError(w, http.StatusServiceUnavailable, provider.CodeUnavailable, "the provider is unavailable (injected fault); nothing was charged")
		return
	case provider.FaultSlow:
		if !s.wait(w, r, f.Delay, in) {
			return
		}
	}
	out := s.store.charge(in, f.Mode == provider.FaultDecline, time.Now())
	s.logOutcome(in, out)
	if f.Mode == provider.FaultLoseAnswer {
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
		writeError(w, http.StatusServiceUnavailable, provider.CodeUnavailable, "the provider is shutting down; nothing was charged")
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
	key := r.Header.Get(provider.HeaderIdempotencyKey)
	if key == "" {
		writeError(w, http.StatusBadRequest, provider.CodeKeyMissing, "header "+provider.HeaderIdempotencyKey+" is required")
		return chargeInput{}, false
	}
	if err := validateProviderKey(key); err != nil {
		writeError(w, http.StatusBadRequest, provider.CodeKeyInvalid, err.Error())
		return chargeInput{}, false
	}
	in := chargeInput{Key: key}
	if v := r.Header.Get(provider.HeaderFencingToken); v != "" {
		tok, err := strconv.ParseInt(v, 10, 64)
		if err != nil || tok < 0 {
			writeError(w, http.StatusBadRequest, provider.CodeFencingTokenInvalid, "header "+provider.HeaderFencingToken+" must be a non-negative int64")
			return chargeInput{}, false
		}
		in.Token, in.HasToken = tok, true
	}
	// Read the body to its end: only then does net/http watch the
	// connection and cancel the request context when the client leaves,
	// which a slow fault relies on.
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, provider.CodeInvalidRequest, fmt.Sprintf("the body could not be read or is larger than %d bytes", maxBodyBytes))
		return chargeInput{}, false
	}
	var body provider.ChargeBody
	if err := strictjson.DecodeObject(raw, &body); err != nil {
		writeError(w, http.StatusBadRequest, provider.CodeInvalidRequest,
			"the body must be one JSON object of amountMinor, currency and accountId (exact names, each once, valid UTF-8)")
		return chargeInput{}, false
	}
	if body.AmountMinor <= 0 {
		writeError(w, http.StatusBadRequest, provider.CodeInvalidRequest, "amountMinor must be positive")
		return chargeInput{}, false
	}
	if !validCurrency(body.Currency) {
		writeError(w, http.StatusBadRequest, provider.CodeInvalidRequest, "currency must be three upper-case letters")
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
	id, ok := strings.CutPrefix(key, provider.ProviderKeyPrefix)
	if !ok || id == "" {
		return fmt.Errorf("provider key must look like %s<paymentId>", provider.ProviderKeyPrefix)
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
		w.Header().Set(provider.HeaderReplayed, "true")
		writeJSON(w, http.StatusOK, out.charge)
	case outcomeDeclined:
		writeError(w, http.StatusPaymentRequired, provider.CodeDeclined, out.decline.Message)
	case outcomeDeclineReplayed:
		w.Header().Set(provider.HeaderReplayed, "true")
		writeError(w, http.StatusPaymentRequired, provider.CodeDeclined, out.decline.Message)
	case outcomeStaleToken:
		writeError(w, http.StatusConflict, provider.CodeFencingTokenStale,
			fmt.Sprintf("fencing token is lower than the highest seen for this key (%d); nothing was charged", out.highest))
	case outcomeKeyReused:
		writeError(w, http.StatusConflict, provider.CodeKeyReused, "the provider key was already used with a different amount or currency")
	default:
		writeError(w, http.StatusServiceUnavailable, provider.CodeUnavailable, "the provider could not record the charge; nothing was charged")
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
		writeError(w, http.StatusNotFound, provider.CodeChargeNotFound, "no charge was applied for this provider key")
		return
	}
	writeJSON(w, http.StatusOK, ch)
}

func (s *Server) handleSetFault(w http.ResponseWriter, r *http.Request) {
	var f provider.Fault
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err == nil {
		err = strictjson.DecodeObject(raw, &f)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, provider.CodeInvalidFault,
			`the body must be one JSON object {"mode","times","delay"} (exact names, each once, valid UTF-8, delay a Go duration)`)
		return
	}
	f, err = s.SetFault(f)
	if err != nil {
		writeError(w, http.StatusBadRequest, provider.CodeInvalidFault, err.Error())
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

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, provider.ErrorBody{ErrorCode: code, Message: msg})
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
