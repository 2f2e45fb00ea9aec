// Package stripeclient builds a stripe-go client whose API base URL is an
// idemd node (the sidecar serves /v1/charges there), with a transport that
// records every attempt of the SDK's own retry loop, so that a program or a
// test can show what the SDK sent and what each attempt got back.
package stripeclient

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v84"
)

// Config configures New.
type Config struct {
	// URL is the API base URL: an idemd node's, "http://127.0.0.1:8081"
	// (the SDK appends "/v1/charges").
	URL string
	// Key is the API key the SDK sends as "Authorization: Bearer KEY":
	// through the sidecar, the tenant's idemd token.
	Key string
	// Timeout is the HTTP client's timeout for one attempt (0: the SDK's
	// default, 80s).
	Timeout time.Duration
	// MaxNetworkRetries is the SDK's retry budget after the first attempt
	// (stripe-go's default is 2; 0 here means no retry).
	MaxNetworkRetries int64
	// Transport carries the requests (nil: http.DefaultTransport); wrap it
	// in a Recorder to see each attempt.
	Transport http.RoundTripper
	// Logger receives the SDK's own log lines ("Initiating retry 1 ...");
	// nil logs nothing.
	Logger stripe.LeveledLoggerInterface
	// NoRetrySleep turns off the SDK's back-off between attempts (500ms,
	// then 1s, 2.5s and 5s from then on, less up to a quarter of jitter),
	// for tests of what it retries rather than when.
	NoRetrySleep bool
}

// New returns a stripe-go client configured by cfg.
func New(cfg Config) *stripe.Client {
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 80 * time.Second
	}
	var logger stripe.LeveledLoggerInterface = &stripe.LeveledLogger{Level: stripe.LevelNull}
	if cfg.Logger != nil {
		logger = cfg.Logger
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(cfg.URL),
		HTTPClient:        &http.Client{Timeout: timeout, Transport: cfg.Transport},
		MaxNetworkRetries: stripe.Int64(cfg.MaxNetworkRetries),
		LeveledLogger:     logger,
	})
	if impl, ok := backend.(*stripe.BackendImplementation); ok && cfg.NoRetrySleep {
		impl.SetNetworkRetriesSleep(false)
	}
	return stripe.NewClient(cfg.Key, stripe.WithBackends(&stripe.Backends{
		API: backend, Connect: backend, Uploads: backend, MeterEvents: backend,
	}))
}

// Attempt is one HTTP request of the SDK's retry loop and what came back.
type Attempt struct {
	// Started is when the attempt was sent, Took how long it took.
	Started time.Time
	Took    time.Duration
	// Method, URL, IdempotencyKey and Body are what the SDK sent.
	Method, URL, IdempotencyKey string
	Body                        string
	// Header is the request's headers as sent.
	Header http.Header
	// Status, ResponseHeader and ResponseBody are the answer (Status 0:
	// none arrived).
	Status         int
	ResponseHeader http.Header
	ResponseBody   string
	// Err is the transport's error (a timeout, a reset), or ErrLostAnswer.
	Err error
}

// Replayed reports whether the answer carried Idempotent-Replayed: true.
func (a Attempt) Replayed() bool {
	return a.ResponseHeader != nil && a.ResponseHeader.Get("Idempotent-Replayed") == "true"
}

// String is one line for a log.
func (a Attempt) String() string {
	s := fmt.Sprintf("%s %s Idempotency-Key=%q", a.Method, a.URL, a.IdempotencyKey)
	switch {
	case errors.Is(a.Err, ErrLostAnswer):
		s += fmt.Sprintf(" -> %d, answer dropped before the SDK saw it", a.Status)
	case a.Err != nil:
		s += fmt.Sprintf(" -> error after %v: %v", a.Took.Round(time.Millisecond), a.Err)
	default:
		s += fmt.Sprintf(" -> %d after %v", a.Status, a.Took.Round(time.Millisecond))
		if a.Replayed() {
			s += " (Idempotent-Replayed: true)"
		}
	}
	return s
}

// ErrLostAnswer is what Recorder returns for an answer it drops
// (Recorder.LoseAnswers): the request reached the server and was answered,
// but the client never saw the answer, as after a connection reset.
var ErrLostAnswer = errors.New("stripeclient: answer lost (simulated connection reset)")

// Recorder is an http.RoundTripper that records every attempt; it can drop
// answers to make the SDK retry a request the server did process.
type Recorder struct {
	// Base carries the requests (nil: http.DefaultTransport).
	Base http.RoundTripper
	// LoseAnswers is how many of the next answers to drop after reading
	// them whole: the SDK gets ErrLostAnswer instead.
	LoseAnswers int
	// Log, when set, is called with each attempt once it has ended.
	Log func(Attempt)

	mu       sync.Mutex
	attempts []Attempt
}

// RoundTrip sends req through Base and records it.
func (r *Recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	a := Attempt{Started: time.Now(), Method: req.Method, URL: req.URL.String(),
		IdempotencyKey: req.Header.Get("Idempotency-Key"), Header: req.Header.Clone()}
	out := req
	if req.Body != nil && req.Body != http.NoBody {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		a.Body = string(b)
		out = req.Clone(req.Context())
		out.Body = io.NopCloser(bytes.NewReader(b))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	base := r.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(out)
	if err == nil {
		var b []byte
		b, err = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		a.Status, a.ResponseHeader, a.ResponseBody = resp.StatusCode, resp.Header.Clone(), string(b)
		resp.Body = io.NopCloser(bytes.NewReader(b))
	}
	a.Took, a.Err = time.Since(a.Started), err
	r.mu.Lock()
	if err == nil && r.LoseAnswers > 0 {
		r.LoseAnswers--
		a.Err, resp, err = ErrLostAnswer, nil, ErrLostAnswer
	}
	r.attempts = append(r.attempts, a)
	r.mu.Unlock()
	if r.Log != nil {
		r.Log(a)
	}
	return resp, err
}

// Attempts returns the attempts recorded so far, in order.
func (r *Recorder) Attempts() []Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Attempt(nil), r.attempts...)
}

// Reset forgets the attempts recorded so far.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts = nil
}

// Logf adapts a Printf-like function (log.Printf, testing.T.Logf) to the
// SDK's logger, prefixing each line with its level.
type Logf func(format string, args ...any)

// Debugf implements stripe.LeveledLoggerInterface.
func (f Logf) Debugf(format string, v ...any) { f("stripe debug: "+format, v...) }

// Infof implements stripe.LeveledLoggerInterface.
func (f Logf) Infof(format string, v ...any) { f("stripe info: "+format, v...) }

// Warnf implements stripe.LeveledLoggerInterface.
func (f Logf) Warnf(format string, v ...any) { f("stripe warn: "+format, v...) }

// Errorf implements stripe.LeveledLoggerInterface.
func (f Logf) Errorf(format string, v ...any) { f("stripe error: "+format, v...) }
