package payments_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/internal/storetest"
	"github.com/idemcoord/idem/payments"
)

// TestByteEqualRetryIsNotParsed: with settled answers in memory, a retry
// with the first request's bytes and Api-Version (sent or left to its
// default) is replayed without its command being parsed; the same command
// re-serialised (members in another order, 10.0 for "10.00") is parsed and
// replayed; another command is parsed and refused; a body that does not
// parse gets its own error; an unsupported Api-Version is refused before
// anything. The record keeps the first request's raw hash.
func TestByteEqualRetryIsNotParsed(t *testing.T) {
	st, _ := storetest.New(t)
	s := payments.NewService(st, payments.Config{Window: time.Hour, AnswerCache: engine.AnswerCache{Bytes: 1 << 20}})
	ctx := context.Background()
	send := func(body, apiVersion string) (*payments.Call, payments.Result, error) {
		t.Helper()
		req := payments.Request{Tenant: "tenant-a", Key: "k1", Body: []byte(body), APIVersion: apiVersion}
		call, err := s.Prepare(req)
		if err != nil {
			return nil, payments.Result{}, err
		}
		ans, err := s.Engine().Do(ctx, call.Request(req))
		return call, payments.Result{Response: ans.Response, Replayed: ans.Replayed, Outcome: ans.Outcome}, err
	}
	const body = `{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"order-1"}`
	call, first, err := send(body, "")
	if err != nil || first.Response.Status != 201 || !call.Parsed() {
		t.Fatalf("first = %+v, %v (parsed %v)", first, err, call.Parsed())
	}
	rec, err := st.Get(ctx, idem.Scope{Tenant: "tenant-a", Operation: payments.Operation, Key: "k1"})
	if err != nil || rec.RawHash != call.RawHash() || rec.RawHash == "" {
		t.Fatalf("record's raw hash %q (%v), want the first request's %q", rec.RawHash, err, call.RawHash())
	}
	for _, version := range []string{"", payments.DefaultAPIVersion} {
		call, again, err := send(body, version)
		if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, first.Response.Body) {
			t.Fatalf("byte-equal retry (Api-Version %q) = %+v, %v", version, again, err)
		}
		if call.Parsed() {
			t.Errorf("a byte-equal retry (Api-Version %q) was parsed", version)
		}
	}
	call, again, err := send(`{"merchantReference":"order-1","currency":"eur","amount":10.0,"accountId":"acc_1"}`, "")
	if err != nil || !again.Replayed || !bytes.Equal(again.Response.Body, first.Response.Body) || !call.Parsed() {
		t.Errorf("re-serialised retry = %+v, %v (parsed %v), want the first answer", again, err, call.Parsed())
	}
	call, _, err = send(`{"accountId":"acc_1","amount":"10.01","currency":"EUR","merchantReference":"order-1"}`, "")
	if idem.ErrorCode(err) != idem.ECodeKeyReused || !call.Parsed() {
		t.Errorf("another command: %v (parsed %v), want %s", err, call.Parsed(), idem.ECodeKeyReused)
	}
	if _, _, err = send(`{"accountId":"acc_1",`, ""); idem.ErrorCode(err) != idem.ECodeRequestMalformed {
		t.Errorf("a body that does not parse: %v, want %s", err, idem.ECodeRequestMalformed)
	}
	if _, _, err = send(body, "2030-01-01"); idem.ErrorCode(err) != idem.ECodeAPIVersionUnsupported {
		t.Errorf("an unsupported Api-Version: %v, want %s", err, idem.ECodeAPIVersionUnsupported)
	}
	if n := storetest.Count(t, st, `SELECT count(*) FROM payments`); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
}
