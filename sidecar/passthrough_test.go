package sidecar_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
	"github.com/idemcoord/idem/sidecar"
)

// checkNotStored fails unless the record of key is settled as st with the
// upstream's status and no body, marked idemhttp.NotStoredSchema.
func (f *fixture) checkNotStored(t *testing.T, key string, st idem.Status, status int) {
	t.Helper()
	f.waitForRecord(t, "tenant-a", key, st)
	rec := f.record(t, "tenant-a", key)
	if rec.Response == nil || rec.Response.Status != status || rec.Response.SchemaVersion != idemhttp.NotStoredSchema || len(rec.Response.Body) != 0 {
		t.Fatalf("record %s: response %+v, want %d, %q and no body", key, rec.Response, status, idemhttp.NotStoredSchema)
	}
}

// checkRetriesGone fails unless two retries of key answer 410
// IDEMPOTENCY_RESPONSE_NOT_STORED and the upstream executed key's derived
// key once and received it once.
func (f *fixture) checkRetriesGone(t *testing.T, key string, headers ...string) {
	t.Helper()
	for range 2 {
		a := f.post(t, "tok-a", key, "/transfers", transfer, headers...)
		if a.status != http.StatusGone || a.code() != idem.ECodeResponseNotStored || a.header.Get("Retry-After") != "" ||
			a.header.Get("Content-Type") != idemhttp.ProblemContentType {
			t.Fatalf("retry of %s: %+v, want 410 %s", key, a, idem.ECodeResponseNotStored)
		}
	}
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", key, 0)
	if e, r := f.up.counts(); e[derived] != 1 || r[derived] != 1 {
		t.Errorf("%s: upstream executions %d, received %d; want 1 and 1", key, e[derived], r[derived])
	}
}

// TestOversizedAnswerPassedThrough: an answer larger than the route's
// max-response, with a Content-Length or without, reaches the client in
// full, once; the record is COMPLETED without the body, and retries answer
// 410 IDEMPOTENCY_RESPONSE_NOT_STORED without calling the upstream.
func TestOversizedAnswerPassedThrough(t *testing.T) {
	f := newFixture(t, ";max-response=1024")
	for _, tc := range []struct {
		key, shape string
		size       int
		length     int64 // the Content-Length the client sees
	}{
		{"k-length", "length:5000", 5000, 5000},
		{"k-chunked", "chunked:70000", 70000, -1},
	} {
		req, err := http.NewRequest(http.MethodPost, f.url+"/transfers", strings.NewReader(transfer))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer tok-a")
		req.Header.Set("Idempotency-Key", tc.key)
		req.Header.Set("X-Answer", tc.shape)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated || len(body) != tc.size || !strings.HasPrefix(string(body), `{"transfer":"tr_`) {
			t.Fatalf("%s: %d, %d bytes (%v); want 201 and %d bytes", tc.key, resp.StatusCode, len(body), err, tc.size)
		}
		if resp.ContentLength != tc.length || resp.Header.Get("Location") == "" || resp.Header.Get("Idempotent-Replayed") != "" ||
			resp.Header.Get("Idempotency-Window") == "" {
			t.Errorf("%s: Content-Length %d (want %d), headers %v", tc.key, resp.ContentLength, tc.length, resp.Header)
		}
		f.checkNotStored(t, tc.key, idem.StatusCompleted, http.StatusCreated)
		f.checkRetriesGone(t, tc.key, "X-Answer", tc.shape)
	}
	if got := f.calls(t, "execute", "completed"); got != 2 {
		t.Errorf("completed calls = %v, want 2", got)
	}
}

// TestAnswerUnderTheCapReplayed: an answer within max-response, with a
// Content-Length or without, is stored and replayed byte for byte, as
// before.
func TestAnswerUnderTheCapReplayed(t *testing.T) {
	f := newFixture(t, ";max-response=4096")
	for _, shape := range []string{"length:4096", "chunked:4000"} {
		key := "k-" + shape
		first := f.post(t, "tok-a", key, "/transfers", transfer, "X-Answer", shape)
		second := f.post(t, "tok-a", key, "/transfers", transfer, "X-Answer", shape)
		if first.status != http.StatusCreated || len(first.body) < 4000 || second.status != first.status || second.body != first.body ||
			second.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: first %d (%d bytes), replay %d (%d bytes, replayed %q)", shape, first.status, len(first.body),
				second.status, len(second.body), second.header.Get("Idempotent-Replayed"))
		}
		rec := f.record(t, "tenant-a", key)
		if rec.Status != idem.StatusCompleted || rec.Response == nil || rec.Response.SchemaVersion != "" || string(rec.Response.Body) != first.body {
			t.Errorf("%s: record %s %+v", shape, rec.Status, rec.Response)
		}
	}
	if n := f.up.total(); n != 2 {
		t.Errorf("upstream executions = %d, want 2", n)
	}
}

// TestEventStreamPassedThrough: a text/event-stream answer streams: the
// client reads the first event before the upstream sends the second. It
// is never replayed: the retry answers 410 without calling the upstream.
func TestEventStreamPassedThrough(t *testing.T) {
	f := newFixture(t, "")
	req, err := http.NewRequest(http.MethodPost, f.url+"/transfers", strings.NewReader(transfer))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", "k-events")
	req.Header.Set("X-Answer", "events")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream answered %d %v", resp.StatusCode, resp.Header)
	}
	events := bufio.NewReader(resp.Body)
	first, err := events.ReadString('\n')
	if err != nil || first != "data: one\n" {
		t.Fatalf("first event %q: %v", first, err)
	}
	// Only now may the upstream send the second.
	close(f.up.next)
	rest, err := io.ReadAll(events)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest of the stream %q: %v", rest, err)
	}
	f.checkNotStored(t, "k-events", idem.StatusCompleted, http.StatusOK)
	f.checkRetriesGone(t, "k-events", "X-Answer", "events")
}

// TestPassedThroughAnswerBrokenOff: an answer that breaks off while it is
// passed on aborts the client's connection (it cannot take the part for
// the whole); the record is settled by the status the upstream sent, and
// the retry answers 410 without a second execution.
func TestPassedThroughAnswerBrokenOff(t *testing.T) {
	f := newFixture(t, ";max-response=1024")
	req, err := http.NewRequest(http.MethodPost, f.url+"/transfers", strings.NewReader(transfer))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", "k-cut")
	req.Header.Set("X-Answer", "cut:8000")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !errors.Is(err, io.ErrUnexpectedEOF) || len(body) != 4000 {
		t.Fatalf("broken-off answer: %d, %d bytes, %v; want 201, 4000 bytes and an unexpected EOF", resp.StatusCode, len(body), err)
	}
	f.checkNotStored(t, "k-cut", idem.StatusCompleted, http.StatusCreated)
	f.checkRetriesGone(t, "k-cut", "X-Answer", "cut:8000")
}

// TestLookupAnswerTooLargeToStore: a lost answer whose lookup answer is
// larger than max-response is settled (it happened) without a body: the
// retry answers 410, never a second execution.
func TestLookupAnswerTooLargeToStore(t *testing.T) {
	f := newFixture(t, ";lookup={up}/transfers/by-key/{derivedKey};max-response=16")
	derived := sidecar.DerivedKey("tenant-a", "create_transfer", "kl", 0)
	f.up.hangUp[derived] = true
	if a := f.post(t, "tok-a", "kl", "/transfers", transfer); a.status != http.StatusAccepted || a.code() != idem.ECodeOutcomeUnknown {
		t.Fatalf("lost answer: %+v", a)
	}
	f.checkRetriesGone(t, "kl")
	f.checkNotStored(t, "kl", idem.StatusCompleted, http.StatusOK)
	if got := f.calls(t, "lookup", "completed"); got != 1 {
		t.Errorf("lookup completed = %v, want 1", got)
	}
}

// TestPassedThroughClientGone: a client that hangs up in the middle of a
// passed-through answer cancels nothing: the upstream's answer is read to
// its end and the record settled, so the retry answers 410 at once.
func TestPassedThroughClientGone(t *testing.T) {
	f := newFixture(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/transfers", strings.NewReader(transfer))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-a")
	req.Header.Set("Idempotency-Key", "k-gone")
	req.Header.Set("X-Answer", "events")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	time.Sleep(50 * time.Millisecond)
	close(f.up.next)
	f.checkNotStored(t, "k-gone", idem.StatusCompleted, http.StatusOK)
	f.checkRetriesGone(t, "k-gone", "X-Answer", "events")
}
