package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/payments"
	"github.com/idemcoord/idem/payments/paymentsnode"
	"github.com/idemcoord/idem/region"
	"github.com/idemcoord/idem/store"
)

// Operation names of the http suite.
const (
	OpHTTPBaseline   = "http baseline"
	OpHTTPIdempotent = "http idempotent"
	OpHTTPReplay     = "http replay"
	OpHTTPGet        = "http get"
	OpHTTPFixed      = "http fixed answer"
)

const benchToken = "bench-token"

// baselineHandler serves POST /payments without the idempotency layer: the
// same bearer-token check (SHA-256, constant-time), media type check, bounded
// body read, strict command decode, business write (payments.InsertPaymentOnly
// in a SERIALIZABLE transaction) and v2 render as the node's handler, for
// the payment the node writes for the same command (its id a hash).
type baselineHandler struct {
	st     *store.Store
	token  [sha256.Size]byte
	tenant string
}

// v2Payment is the v2 body of a payment, as the node renders it.
type v2Payment struct {
	PaymentID         string `json:"paymentId"`
	Status            string `json:"status"`
	AccountID         string `json:"accountId"`
	Amount            string `json:"amount"`
	Currency          string `json:"currency"`
	MerchantReference string `json:"merchantReference"`
	Channel           string `json:"channel"`
}

func (h *baselineHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/payments" {
		http.Error(w, `{"errorCode":"NOT_FOUND"}`, http.StatusNotFound)
		return
	}
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(sum[:], h.token[:]) != 1 {
		http.Error(w, `{"errorCode":"UNAUTHENTICATED"}`, http.StatusUnauthorized)
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, `{"errorCode":"UNSUPPORTED_MEDIA_TYPE"}`, http.StatusUnsupportedMediaType)
		return
	}
	writePayment(w, r, h.st, h.tenant, "")
}

// fixedAnswerHandler answers POST /payments with one fixed payment, as a
// replay does, after the same checks as baselineHandler and the same bounded
// body read, with no idempotency layer and no store: the floor of a replay
// over HTTP on the machine that runs the suite (the same client, server and
// connection work; none of the layer's).
type fixedAnswerHandler struct {
	baseline *baselineHandler
	body     []byte
}

func (h *fixedAnswerHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(token))
	if r.Method != http.MethodPost || subtle.ConstantTimeCompare(sum[:], h.baseline.token[:]) != 1 {
		http.Error(w, `{"errorCode":"UNAUTHENTICATED"}`, http.StatusUnauthorized)
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, `{"errorCode":"UNSUPPORTED_MEDIA_TYPE"}`, http.StatusUnsupportedMediaType)
		return
	}
	if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, region.DefaultMaxBodyBytes)); err != nil {
		http.Error(w, `{"errorCode":"VALIDATION_FAILED"}`, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/pay_fixed")
	w.Header().Set("Idempotent-Replayed", "true")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(h.body)
}

// writePayment reads the bounded body, does the business write under id
// and answers 201 with the v2 payment: the part of a handler without the
// layer that follows its authentication.
func writePayment(w http.ResponseWriter, r *http.Request, st *store.Store, tenant, id string) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, region.DefaultMaxBodyBytes))
	if err != nil {
		http.Error(w, `{"errorCode":"VALIDATION_FAILED"}`, http.StatusBadRequest)
		return
	}
	p, err := baselineWrite(r.Context(), st, tenant, id, b)
	if err != nil {
		http.Error(w, `{"errorCode":"VALIDATION_FAILED"}`, http.StatusBadRequest)
		return
	}
	out, err := json.Marshal(v2Payment{PaymentID: p.ID, Status: p.Status, AccountID: p.AccountID,
		Amount: payments.FormatMinor(p.AmountMinor, p.Currency), Currency: p.Currency,
		MerchantReference: p.MerchantReference, Channel: p.Channel})
	if err != nil {
		http.Error(w, `{"errorCode":"INTERNAL"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+p.ID)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out)
}

// poster sends POST /payments with fresh keys and bodies to base.
func poster(client *http.Client, base string, w *writer, prefix string) func(context.Context) error {
	return post(client, base+"/payments", benchToken, w, prefix)
}

// post sends POSTs of fresh keys and bodies to url and wants 201, not a
// replay; token, when set, is sent as the bearer token.
func post(client *http.Client, url, token string, w *writer, prefix string) func(context.Context) error {
	return func(ctx context.Context) error {
		n := w.seq.Add(1)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body(w.run+prefix, n)))
		if err != nil {
			return err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", w.key(prefix, n))
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err == nil && (resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "") {
			err = fmt.Errorf("%w: POST %s: %d", errUnexpected, req.URL.Path, resp.StatusCode)
		}
		return err
	}
}

// answerCacheBytes is the answer cache of the HTTP suite's node: idemd's
// default.
const answerCacheBytes = 64 << 20

func runHTTP(ctx context.Context, st *store.Store, cfg Config) (SuiteReport, error) {
	w := newWriter(SuiteHTTP, cfg)
	// The node keeps settled answers in memory as idemd does by default
	// (--answer-cache-bytes, 64 MiB): a replay is answered from there.
	cache := engine.AnswerCache{Bytes: answerCacheBytes}
	node, err := region.NewServer(region.Config{Addr: "127.0.0.1:0", Region: "bench", Tokens: map[string]string{benchToken: w.tenant},
		AnswerCacheBytes: answerCacheBytes},
		st, paymentsnode.Operation(payments.NewService(st, payments.Config{Region: "bench", AnswerCache: cache}), paymentsnode.Outbox{}))
	if err != nil {
		return SuiteReport{}, err
	}
	if err := node.Open(); err != nil {
		return SuiteReport{}, err
	}
	defer func() { _ = node.Close(context.WithoutCancel(ctx)) }()

	base := &baselineHandler{st: st, token: sha256.Sum256([]byte(benchToken)), tenant: w.tenant}
	baseURL, stopBase, err := serve(base)
	if err != nil {
		return SuiteReport{}, err
	}
	defer stopBase(context.WithoutCancel(ctx))

	tr := benchTransport(cfg)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	// Completed payments that replays retry and reads get, in turn.
	seeded, err := seedHTTP(ctx, client, node.URL(), w, "r", cfg.ReplayKeys)
	if err != nil {
		return SuiteReport{}, err
	}
	// The fixed answer is a seeded payment's body as the node renders it.
	fixed, err := fixedAnswer(ctx, client, node.URL(), seeded[0])
	if err != nil {
		return SuiteReport{}, err
	}
	fixedURL, stopFixed, err := serve(&fixedAnswerHandler{baseline: base, body: fixed})
	if err != nil {
		return SuiteReport{}, err
	}
	defer stopFixed(context.WithoutCancel(ctx))
	results, err := alternate(ctx, cfg, SuiteHTTP, []op{
		{OpHTTPBaseline, poster(client, baseURL, w, "b")},
		{OpHTTPIdempotent, poster(client, node.URL(), w, "i")},
		{OpHTTPReplay, httpReplayer(client, node.URL(), w, "r", seeded)},
		{OpHTTPGet, httpGetter(client, node.URL(), seeded)},
		{OpHTTPFixed, httpReplayer(client, fixedURL, w, "r", seeded)},
	})
	if err != nil {
		return SuiteReport{}, err
	}
	rep := SuiteReport{Suite: SuiteHTTP, Concurrency: cfg.Concurrency, Results: results, Seeded: len(seeded),
		Ratios: []Ratio{ratio(results, OpHTTPIdempotent, OpHTTPBaseline), ratio(results, OpHTTPReplay, OpHTTPGet),
			ratio(results, OpHTTPReplay, OpHTTPIdempotent), ratio(results, OpHTTPFixed, OpHTTPIdempotent), ratio(results, OpHTTPReplay, OpHTTPFixed)}}
	rep.Payments, rep.Records, err = countRows(ctx, st, w.tenant)
	return rep, err
}

// seedHTTP creates n payments through the node at base, keys
// w.key(prefix, 0..n-1), and returns their ids.
func seedHTTP(ctx context.Context, client *http.Client, base string, w *writer, prefix string, n int) ([]string, error) {
	ids := make([]string, n)
	for i := range n {
		resp, err := sendPayment(ctx, client, base, w, prefix, int64(i))
		if err != nil {
			return nil, fmt.Errorf("seed payments: %w", err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated {
			return nil, fmt.Errorf("seed payments: %w: %d", errUnexpected, resp.StatusCode)
		}
		id, ok := strings.CutPrefix(resp.Header.Get("Location"), "/payments/")
		if !ok || id == "" {
			return nil, fmt.Errorf("seed payments: %w: no Location", errUnexpected)
		}
		ids[i] = id
	}
	return ids, nil
}

// sendPayment POSTs the payment of key w.key(prefix, i) and its body.
func sendPayment(ctx context.Context, client *http.Client, base string, w *writer, prefix string, i int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/payments", bytes.NewReader(body(w.run+prefix, i)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+benchToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", w.key(prefix, i))
	return client.Do(req)
}

// httpReplayer retries the seeded payments in turn and wants each
// replayed: 201 with Idempotent-Replayed.
func httpReplayer(client *http.Client, base string, w *writer, prefix string, seeded []string) func(context.Context) error {
	var seq atomic.Int64
	return func(ctx context.Context) error {
		i := seq.Add(1) % int64(len(seeded))
		resp, err := sendPayment(ctx, client, base, w, prefix, i)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err == nil && (resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true") {
			err = fmt.Errorf("%w: replay of %s-%d: %d", errUnexpected, prefix, i, resp.StatusCode)
		}
		return err
	}
}

// fixedAnswer is the body of GET /payments/{id} at base.
func fixedAnswer(ctx context.Context, client *http.Client, base, id string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/payments/"+id, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+benchToken)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%w: GET /payments/%s: %d", errUnexpected, id, resp.StatusCode)
	}
	return b, err
}

// httpGetter reads the seeded payments in turn (GET /payments/{id}) and
// wants 200: the read a replay is compared with, through the same node.
func httpGetter(client *http.Client, base string, seeded []string) func(context.Context) error {
	var seq atomic.Int64
	return func(ctx context.Context) error {
		id := seeded[seq.Add(1)%int64(len(seeded))]
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/payments/"+id, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+benchToken)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%w: GET /payments/%s: %d", errUnexpected, id, resp.StatusCode)
		}
		return err
	}
}
