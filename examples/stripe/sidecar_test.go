package stripeexample_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v84"

	"github.com/idemcoord/idem/cluster"
	"github.com/idemcoord/idem/examples/stripe/fakestripe"
	"github.com/idemcoord/idem/examples/stripe/stripeclient"
	"github.com/idemcoord/idem/internal/testbin"
	"github.com/idemcoord/idem/sidecar"
)

const (
	tenant    = "tenant-a"
	operation = "create_charge"
	// keyReused is the errorCode of a key sent again with another request.
	keyReused = "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST"
)

// route is the sidecar route of the walkthrough for an upstream at base:
// the upstream call may take 10s, a retry that finds the first call still
// running waits up to 10s for its answer, the upstream's Request-Id is
// stored and replayed with the answer, Stripe-Version is part of the
// request's meaning, an unknown outcome is a 503 (an error to the SDK, not
// an empty charge), and the sidecar's own errors are Stripe error objects,
// which stripe-go returns as *stripe.Error with the status.
func route(base string) string {
	return "POST /v1/charges=" + operation + "@" + base +
		";timeout=10s;wait=10s;replay-header=Request-Id;header=Stripe-Version;unknown-status=503;error-envelope=stripe"
}

// sidecarError checks that err is the *stripe.Error of the sidecar's own
// answer status with code, of Stripe error type typ, and returns it.
func sidecarError(t *testing.T, err error, status int, typ stripe.ErrorType, code string) *stripe.Error {
	t.Helper()
	var se *stripe.Error
	if !errors.As(err, &se) {
		t.Fatalf("%T %v: want *stripe.Error", err, err)
	}
	if se.HTTPStatusCode != status || se.Type != typ || string(se.Code) != code || se.Msg == "" ||
		!strings.HasPrefix(se.DocURL, "https://") || !strings.HasSuffix(se.DocURL, "#"+strings.ToLower(code)) {
		t.Errorf("%+v: want HTTP %d, type %s, code %s, a message and the code's documentation as doc_url", se, status, typ, code)
	}
	if ct := se.LastResponse.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	return se
}

// TestStripeSDKThroughSidecar builds idemd, idemctl and etcd, starts the
// fake Stripe upstream in process and a local three-region cluster whose
// nodes proxy POST /v1/charges to it, and drives a node of a region that is
// not the tenant's home (so every call is forwarded) with the official
// stripe-go client, the tenant's token as its API key.
func TestStripeSDKThroughSidecar(t *testing.T) {
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	walkthrough := buildWalkthrough(t, here)
	bin := buildBinaries(t)

	fake := fakestripe.New()
	upstream, err := fake.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Close() })

	info, statePath := startCluster(t, bin, route(upstream))
	token := info.Tokens[tenant]
	home := info.Placements[tenant]
	var nodeURL, region string
	for _, r := range info.Regions {
		if r.Name != home {
			nodeURL, region = r.URL, r.Name
			break
		}
	}
	if token == "" || home == "" || nodeURL == "" {
		t.Fatalf("cluster.json: token %q, home %q, regions %+v: want a tenant-a token and a region besides its home", token, home, info.Regions)
	}
	t.Logf("%s's home is %s; the SDK talks to %s (%s), which forwards", tenant, home, region, nodeURL)

	// client returns a stripe-go client for nodeURL and its recorder.
	client := func(t *testing.T, timeout time.Duration, retries int64, lose int) (*stripe.Client, *stripeclient.Recorder) {
		rec := &stripeclient.Recorder{LoseAnswers: lose, Log: func(a stripeclient.Attempt) { t.Logf("attempt: %v", a) }}
		return stripeclient.New(stripeclient.Config{URL: nodeURL, Key: token, Timeout: timeout, MaxNetworkRetries: retries,
			Transport: rec, Logger: stripeclient.Logf(t.Logf)}), rec
	}
	ctx := context.Background()

	t.Run("a: create, and the SDK's retry after a lost answer replays", func(t *testing.T) {
		sc, rec := client(t, 30*time.Second, 3, 1)
		ch, err := sc.V1Charges.Create(ctx, chargeParams(2000, "tok_visa", "order_id", "a"))
		if err != nil {
			t.Fatal(err)
		}
		at := rec.Attempts()
		if len(at) != 2 || !errors.Is(at[0].Err, stripeclient.ErrLostAnswer) || at[0].Status != http.StatusOK || at[1].Status != http.StatusOK {
			t.Fatalf("attempts %v: want a 200 lost on the way and the SDK's retry answered 200", at)
		}
		key := at[0].IdempotencyKey
		if at[1].IdempotencyKey != key || !sdkKeyRE.MatchString(key) {
			t.Errorf("keys %q and %q: want the SDK's own key, the same on its retry", key, at[1].IdempotencyKey)
		}
		if at[0].Replayed() || !at[1].Replayed() || ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("Idempotent-Replayed %v then %v: want the first answer executed and the retry replayed", at[0].Replayed(), at[1].Replayed())
		}
		if at[1].ResponseBody != at[0].ResponseBody || !strings.HasPrefix(ch.ID, "ch_") || ch.Amount != 2000 || ch.Status != stripe.ChargeStatusSucceeded {
			t.Errorf("replay %q after %q, charge %+v: want the same bytes and a succeeded charge", at[1].ResponseBody, at[0].ResponseBody, ch)
		}
		if id := at[0].ResponseHeader.Get("Request-Id"); id == "" || at[1].ResponseHeader.Get("Request-Id") != id || ch.LastResponse.RequestID != id {
			t.Errorf("Request-Id %q then %q (SDK %q): want the upstream's, replayed (replay-header=Request-Id)",
				id, at[1].ResponseHeader.Get("Request-Id"), ch.LastResponse.RequestID)
		}
		derived := checkUpstream(t, fake, key, 1)
		if reqs := fake.RequestsWithKey(derived); len(reqs) == 1 && reqs[0].ChargeID != ch.ID {
			t.Errorf("the SDK holds charge %s, the upstream made %s", ch.ID, reqs[0].ChargeID)
		}

		// The application calls again with the key the SDK used: a replay.
		rec.Reset()
		p := chargeParams(2000, "tok_visa", "order_id", "a")
		p.SetIdempotencyKey(key)
		again, err := sc.V1Charges.Create(ctx, p)
		if err != nil || again.ID != ch.ID || again.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("second call: %v, charge %q (replayed %q); want %s replayed", err, again.ID, again.LastResponse.Header.Get("Idempotent-Replayed"), ch.ID)
		}

		// The same form with its fields in another order is the same
		// request: replayed too.
		fields := strings.Split(at[0].Body, "&")
		for i, j := 0, len(fields)-1; i < j; i, j = i+1, j-1 {
			fields[i], fields[j] = fields[j], fields[i]
		}
		status, hdr, body := rawPost(t, nodeURL+"/v1/charges", at[0].Header, strings.Join(fields, "&"))
		if status != http.StatusOK || hdr.Get("Idempotent-Replayed") != "true" || body != at[0].ResponseBody {
			t.Errorf("reordered form %q: %d, Idempotent-Replayed %q, %s; want the stored 200 replayed", strings.Join(fields, "&"), status, hdr.Get("Idempotent-Replayed"), body)
		}
		checkUpstream(t, fake, key, 1)
	})

	t.Run("b: the client times out while the upstream works; the SDK's retries get the charge", func(t *testing.T) {
		sc, rec := client(t, time.Second, 5, 0)
		began := time.Now()
		ch, err := sc.V1Charges.Create(ctx, chargeParams(3000, "tok_visa", "order_id", "b", fakestripe.MetaDelay, "2500"))
		if err != nil {
			t.Fatalf("after %v: %v", time.Since(began), err)
		}
		at := rec.Attempts()
		t.Logf("%d attempts in %v", len(at), time.Since(began).Round(time.Millisecond))
		if ch.ID == "" {
			// stripe-go takes any answer below 400 for a charge: a 202
			// PAYMENT_OUTCOME_UNKNOWN becomes a nil error and an empty charge.
			t.Errorf("the SDK returned no error and a charge without an id (last answer %d %s)", ch.LastResponse.StatusCode, ch.LastResponse.RawJSON)
		}
		if len(at) < 2 || at[0].Err == nil || at[0].Status != 0 {
			t.Fatalf("attempts %v: want the first to time out", at)
		}
		for _, a := range at[1:] {
			if a.IdempotencyKey != at[0].IdempotencyKey {
				t.Errorf("attempt with key %q after %q: the SDK's loop keeps its key", a.IdempotencyKey, at[0].IdempotencyKey)
			}
		}
		last := at[len(at)-1]
		if last.Status != http.StatusOK || !last.Replayed() {
			t.Errorf("last attempt %v: want 200 with Idempotent-Replayed: true", last)
		}
		derived := checkUpstream(t, fake, at[0].IdempotencyKey, 1)
		reqs := fake.RequestsWithKey(derived)
		if len(reqs) != 1 || reqs[0].Status != http.StatusOK || reqs[0].ChargeID != ch.ID {
			t.Errorf("upstream %+v, SDK charge %q: want the one upstream charge, made after the client left, to be what the SDK got", reqs, ch.ID)
		}
	})

	t.Run("c: a declined card is a 402 the SDK does not retry, replayed on a repeat", func(t *testing.T) {
		sc, rec := client(t, 30*time.Second, 3, 0)
		key := "order-c-declined"
		var errs []*stripe.Error
		for i := range 2 {
			p := chargeParams(2000, fakestripe.DeclinedSource, "order_id", "c")
			p.SetIdempotencyKey(key)
			_, err := sc.V1Charges.Create(ctx, p)
			var se *stripe.Error
			if !errors.As(err, &se) {
				t.Fatalf("call %d: %T %v, want *stripe.Error", i+1, err, err)
			}
			var ce *stripe.CardError
			if se.HTTPStatusCode != http.StatusPaymentRequired || se.Code != stripe.ErrorCodeCardDeclined || se.Type != stripe.ErrorTypeCard ||
				se.DeclineCode != stripe.DeclineCodeGenericDecline || !errors.As(err, &ce) {
				t.Errorf("call %d: %+v, want 402 card_error card_declined generic_decline", i+1, se)
			}
			errs = append(errs, se)
		}
		at := rec.Attempts()
		if len(at) != 2 {
			t.Fatalf("attempts %v: want one per call (the SDK does not retry a card_error)", at)
		}
		if at[0].Replayed() || !at[1].Replayed() || errs[1].LastResponse.Header.Get("Idempotent-Replayed") != "true" || at[1].ResponseBody != at[0].ResponseBody {
			t.Errorf("attempts %v: want the decline stored and replayed byte for byte", at)
		}
		checkUpstream(t, fake, key, 1)
	})

	t.Run("d1: a plain 500 from the upstream is retried by the SDK and executes again", func(t *testing.T) {
		sc, rec := client(t, 30*time.Second, 3, 0)
		ch, err := sc.V1Charges.Create(ctx, chargeParams(4000, "tok_visa", "order_id", "d1", fakestripe.MetaFailOnce, fakestripe.FailPlain))
		if err != nil {
			t.Fatal(err)
		}
		at := rec.Attempts()
		if len(at) != 2 || at[0].Status != http.StatusInternalServerError || at[1].Status != http.StatusOK || at[0].Replayed() || at[1].Replayed() {
			t.Fatalf("attempts %v: want 500, then the SDK's retry executed (200, not replayed)", at)
		}
		derived := checkUpstream(t, fake, at[0].IdempotencyKey, 2)
		if reqs := fake.RequestsWithKey(derived); len(reqs) == 2 && (reqs[0].Status != 500 || reqs[1].ChargeID != ch.ID) {
			t.Errorf("upstream %+v, SDK charge %s", reqs, ch.ID)
		}
	})

	t.Run("d2: a Stripe-shaped 500 is not retried by the SDK; the application's retry executes again", func(t *testing.T) {
		sc, rec := client(t, 30*time.Second, 3, 0)
		key := "order-d2-api-error"
		p := chargeParams(4500, "tok_visa", "order_id", "d2", fakestripe.MetaFailOnce, fakestripe.FailAPIError)
		p.SetIdempotencyKey(key)
		_, err := sc.V1Charges.Create(ctx, p)
		var se *stripe.Error
		if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusInternalServerError || se.Type != stripe.ErrorTypeAPI {
			t.Fatalf("%T %v: want *stripe.Error 500 api_error", err, err)
		}
		if at := rec.Attempts(); len(at) != 1 {
			t.Errorf("attempts %v: stripe-go v84 does not retry an answer with a Stripe error object", at)
		}
		checkUpstream(t, fake, key, 1)
		ch, err := sc.V1Charges.Create(ctx, p)
		if err != nil || ch.LastResponse.Header.Get("Idempotent-Replayed") == "true" {
			t.Fatalf("retry with the same key: %v, replayed %q; want a new execution (a 500 is not stored)", err, ch.LastResponse.Header.Get("Idempotent-Replayed"))
		}
		checkUpstream(t, fake, key, 2)
		again, err := sc.V1Charges.Create(ctx, p)
		if err != nil || again.ID != ch.ID || again.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("third call: %v, %q; want %s replayed", err, again.ID, ch.ID)
		}
		checkUpstream(t, fake, key, 2)
	})

	t.Run("walkthrough: the charge program", func(t *testing.T) {
		key := "order-1001"
		var ids []string
		for i, want := range []string{`Idempotent-Replayed: ""`, `Idempotent-Replayed: "true"`} {
			code, out := runCharge(t, walkthrough.charge, statePath, "-key", key, "-amount", "2000")
			m := chargeIDRE.FindStringSubmatch(out)
			if code != 0 || m == nil || !strings.Contains(out, want) || !strings.Contains(out, "which forwards") {
				t.Fatalf("call %d: exit %d, want 0, a charge, %s and a forwarding region:\n%s", i+1, code, want, out)
			}
			ids = append(ids, m[1])
		}
		if ids[0] != ids[1] {
			t.Errorf("charges %s then %s, want one replayed", ids[0], ids[1])
		}
		if code, out := runCharge(t, walkthrough.charge, statePath, "-key", key, "-amount", "2500", "-retries", "0"); code != 1 || !strings.Contains(out, "HTTP 409 type=idempotency_error code="+keyReused) {
			t.Errorf("changed amount: exit %d, want 1 and %s:\n%s", code, keyReused, out)
		}
		checkUpstream(t, fake, key, 1)
		code, out := runCharge(t, walkthrough.charge, statePath, "-key", "order-1002", "-source", fakestripe.DeclinedSource)
		if code != 1 || !strings.Contains(out, "HTTP 402 type=card_error code=card_declined decline_code=generic_decline") {
			t.Errorf("declined: exit %d, want 1 and the card error:\n%s", code, out)
		}
	})

	t.Run("walkthrough: the upstream program", func(t *testing.T) {
		cmd := exec.Command(walkthrough.upstream, "-port", "0")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill() }()
		line, err := bufio.NewReader(stdout).ReadString('\n')
		base, ok := strings.CutPrefix(strings.TrimSpace(line), "fakestripe listening on ")
		if err != nil || !ok || !strings.HasPrefix(base, "http://127.0.0.1:") {
			t.Fatalf("first line %q (%v), want fakestripe listening on http://127.0.0.1:PORT", line, err)
		}
		resp, err := http.Get(base + "/_counts")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != "{}" {
			t.Errorf("GET /_counts: %s %s, want 200 {}", resp.Status, b)
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("after SIGINT: %v, want exit 0", err)
		}
	})

	t.Run("f: a key still in progress is a 409 the SDK returns as *stripe.Error", func(t *testing.T) {
		key := "order-f-in-progress"
		p := chargeParams(6000, "tok_visa", "order_id", "f", fakestripe.MetaDelay, "2000")
		p.SetIdempotencyKey(key)
		first := make(chan error, 1)
		go func() {
			sc, _ := client(t, 30*time.Second, 0, 0)
			_, err := sc.V1Charges.Create(ctx, p)
			first <- err
		}()
		derived := sidecar.DerivedKey(tenant, operation, key, 0)
		for deadline := time.Now().Add(10 * time.Second); fake.Count(derived) == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the first call never reached the upstream")
			}
		}
		sc, rec := client(t, 30*time.Second, 2, 0)
		again := chargeParams(6000, "tok_visa", "order_id", "f", fakestripe.MetaDelay, "2000")
		again.SetIdempotencyKey(key)
		// Prefer: wait=0 asks for the answer at once instead of the
		// route's wait.
		again.Headers = http.Header{"Prefer": {"wait=0"}}
		_, err := sc.V1Charges.Create(ctx, again)
		se := sidecarError(t, err, http.StatusConflict, stripe.ErrorTypeIdempotency, "IDEMPOTENCY_REQUEST_IN_PROGRESS")
		if ra := se.LastResponse.Header.Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After %q, want 1", ra)
		}
		if at := rec.Attempts(); len(at) != 1 {
			t.Errorf("attempts %v: want one (the SDK does not retry a Stripe error object)", at)
		}
		if err := <-first; err != nil {
			t.Errorf("the first call: %v", err)
		}
		checkUpstream(t, fake, key, 1)
	})

	t.Run("g: an answer lost after the upstream charged is a 503 the SDK returns as *stripe.Error", func(t *testing.T) {
		sc, rec := client(t, 30*time.Second, 2, 0)
		key := "order-g-unknown"
		p := chargeParams(7000, "tok_visa", "order_id", "g", fakestripe.MetaFailOnce, fakestripe.FailDrop)
		p.SetIdempotencyKey(key)
		for i := range 2 {
			rec.Reset()
			_, err := sc.V1Charges.Create(ctx, p)
			se := sidecarError(t, err, http.StatusServiceUnavailable, stripe.ErrorTypeAPI, "OUTCOME_UNKNOWN")
			if ra := se.LastResponse.Header.Get("Retry-After"); ra != "1" {
				t.Errorf("call %d: Retry-After %q, want 1", i+1, ra)
			}
			if at := rec.Attempts(); len(at) != 1 {
				t.Errorf("call %d: attempts %v, want one", i+1, at)
			}
		}
		// The charge was made once; the application's repeat with the key
		// does not charge again: the outcome waits for an operator (or a
		// route's lookup) to settle it.
		derived := checkUpstream(t, fake, key, 1)
		if reqs := fake.RequestsWithKey(derived); len(reqs) != 1 || !reqs[0].Dropped || reqs[0].ChargeID == "" {
			t.Errorf("upstream %+v: want one charge whose answer was dropped", reqs)
		}
	})

	t.Run("e: the same key with another amount is refused with 409", func(t *testing.T) {
		sc, rec := client(t, 30*time.Second, 2, 0)
		key := "order-e-amount"
		p := chargeParams(5000, "tok_visa", "order_id", "e")
		p.SetIdempotencyKey(key)
		ch, err := sc.V1Charges.Create(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		rec.Reset()
		changed := chargeParams(5500, "tok_visa", "order_id", "e")
		changed.SetIdempotencyKey(key)
		_, err = sc.V1Charges.Create(ctx, changed)
		if err == nil {
			t.Fatal("a changed amount under the same key succeeded")
		}
		se := sidecarError(t, err, http.StatusConflict, stripe.ErrorTypeIdempotency, keyReused)
		var ie *stripe.IdempotencyError
		if !errors.As(err, &ie) {
			t.Errorf("%T: want a *stripe.IdempotencyError inside", se.Err)
		}
		// A Stripe error object is not retried by the SDK.
		if at := rec.Attempts(); len(at) != 1 || at[0].Status != http.StatusConflict {
			t.Errorf("attempts %v: want one 409", at)
		}
		checkUpstream(t, fake, key, 1)

		// The original request still replays its charge.
		again, err := sc.V1Charges.Create(ctx, p)
		if err != nil || again.ID != ch.ID {
			t.Errorf("the original request again: %v, %q; want %s", err, again.ID, ch.ID)
		}
		checkUpstream(t, fake, key, 1)
	})
}

var chargeIDRE = regexp.MustCompile(`charge (ch_[A-Za-z0-9]+): `)

// runCharge runs the walkthrough's charge program against the cluster of
// cluster.json at state and returns its exit code and output.
func runCharge(t *testing.T, charge, state string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(charge, append([]string{"-state", state}, args...)...)
	cmd.Env = os.Environ()
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("charge %q: %v", args, err)
	}
	t.Logf("charge %s:\n%s", strings.Join(args, " "), out.String())
	return cmd.ProcessState.ExitCode(), out.String()
}

// buildWalkthrough builds the walkthrough's programs (cmd/charge and
// upstream) from this module's directory dir.
func buildWalkthrough(t *testing.T, dir string) (w struct{ charge, upstream string }) {
	t.Helper()
	out := t.TempDir()
	w.charge, w.upstream = filepath.Join(out, "charge"), filepath.Join(out, "fakestripe")
	for bin, pkg := range map[string]string{w.charge: "./cmd/charge", w.upstream: "./upstream"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = dir
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build -o %s %s: %v\n%s", bin, pkg, err, b)
		}
	}
	return w
}

// checkUpstream checks that the upstream received the client key key's
// derived key (generation 0) want times, with the tenant, a fencing token
// and no Authorization, and returns the derived key.
func checkUpstream(t *testing.T, fake *fakestripe.Server, key string, want int) string {
	t.Helper()
	derived := sidecar.DerivedKey(tenant, operation, key, 0)
	if got := fake.Count(derived); got != want {
		t.Errorf("the upstream executed client key %q (derived %s) %d times, want %d; it saw %+v", key, derived, got, want, fake.Counts())
	}
	if n := fake.Count(key); n != 0 {
		t.Errorf("the upstream received the client's own key %q %d times, want the derived key only", key, n)
	}
	for _, r := range fake.RequestsWithKey(derived) {
		if r.Tenant != tenant || r.FencingToken == "" || r.Authorization {
			t.Errorf("upstream request %+v: want Idem-Tenant %s, a fencing token and no Authorization", r, tenant)
		}
	}
	return derived
}

// rawPost sends body with the headers of a recorded SDK request.
func rawPost(t *testing.T, u string, h http.Header, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h.Clone()
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// buildBinaries builds idemd, idemctl and etcd from the repository's root
// module (two directories up), so that it works in the workspace and with
// GOWORK=off alike.
func buildBinaries(t *testing.T) testbin.Paths {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !bytes.HasPrefix(b, []byte("module github.com/idemcoord/idem\n")) {
		t.Fatalf("%s is not the idem repository's root: %v", root, err)
	}
	dir := t.TempDir()
	t.Chdir(root)
	began := time.Now()
	p, err := testbin.BuildAll(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built idemd, idemctl and etcd in %v", time.Since(began).Round(time.Millisecond))
	return p
}

// startCluster runs "idemctl up" as a child process with routes, waits for
// its cluster.json and stops it (SIGINT) when the test ends.
func startCluster(t *testing.T, bin testbin.Paths, routes string) (cluster.Info, string) {
	t.Helper()
	// The state directory must be reachable by the postgres OS user when
	// the tests run as root (t.TempDir's parent has mode 0700).
	base, err := os.MkdirTemp("", "idem-stripe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "state")

	cmd := exec.Command(bin.Idemctl, "up", "--state-dir", dir, "--idemd", bin.Idemd, "--etcd", bin.Etcd,
		"--etcd-members", "1", "--provider=false", "--proxy-routes", routes)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") { // they would configure idemctl up
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("idemctl up:\n%s", out)
			logNodeLogs(t, dir)
		}
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			t.Errorf("idemctl up still running a minute after SIGINT")
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	path := filepath.Join(dir, cluster.StateFile)
	deadline := time.After(3 * time.Minute)
	for {
		if b, err := os.ReadFile(path); err == nil {
			var info cluster.Info
			if err := json.Unmarshal(b, &info); err != nil {
				t.Fatalf("%s: %v\n%s", path, err, b)
			}
			t.Logf("idemctl up: cluster.json after %v", time.Since(began).Round(time.Millisecond))
			return info, path
		}
		select {
		case <-exited:
			t.Fatalf("idemctl up exited (%v) before writing %s:\n%s", cmd.ProcessState, path, out)
		case <-deadline:
			t.Fatalf("no %s after three minutes:\n%s", path, out)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logNodeLogs logs the last lines of each process log of the cluster.
func logNodeLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		t.Logf("%s (last %d lines):\n%s", l, len(lines), strings.Join(lines, "\n"))
	}
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
