package simulator

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemcoord/idem/provider"
)

// shutdownTimeout bounds the graceful shutdown of [Serve].
const shutdownTimeout = 10 * time.Second

// ChargeIDFor returns the charge id the simulator assigns to a provider key:
// "ch_" followed by the first 16 hex digits of SHA-256(key). It is
// deterministic, so a key can never map to two charges.
func ChargeIDFor(providerKey string) string {
	sum := sha256.Sum256([]byte(providerKey))
	return "ch_" + hex.EncodeToString(sum[:])[:16]
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
