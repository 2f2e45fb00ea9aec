package simulator

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemcoord/idem/internal/strictjson"
	"github.com/idemcoord/idem/provider"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 1 << 20

// maxKeyLen bounds provider keys.
const maxKeyLen = 255

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
			"the body must be one JSON object of amountMinor, currency, accountId and an optional reference (exact names, each once, valid UTF-8)")
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
	if !validReference(body.Reference) {
		writeError(w, http.StatusBadRequest, provider.CodeInvalidRequest,
			fmt.Sprintf("reference must be at most %d letters, digits, '_' and '-'", provider.MaxReferenceLen))
		return chargeInput{}, false
	}
	in.AmountMinor, in.Currency, in.AccountID, in.Reference = body.AmountMinor, body.Currency, body.AccountID, body.Reference
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

// validReference checks an optional charge reference.
func validReference(ref string) bool {
	if len(ref) > provider.MaxReferenceLen {
		return false
	}
	for _, c := range ref {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
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
