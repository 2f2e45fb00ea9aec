package region

import (
	"strings"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/coordapi"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/strictjson"
)

// clientError fails t unless err is an *idem.Error whose status is a 4xx.
func clientError(t *testing.T, what string, err error) {
	t.Helper()
	status := testErrors(t).Status(idem.ErrorCode(err))
	if code := idem.ErrorCode(err); code == idem.ECodeInternal || status >= 500 || status < 400 {
		t.Fatalf("%s: error %v is not a client error (code %q)", what, err, code)
	}
}

// FuzzCoordinationBodies decodes every coordination body type as the
// handlers do: decoding never panics, every rejection is a 4xx *idem.Error,
// and an accepted begin command hashes deterministically under every
// supported version, its canonical form hashing the same.
func FuzzCoordinationBodies(f *testing.F) {
	for _, s := range []string{
		`{"command":{"amount":"10.00","n":1}}`, `{"requestHash":"v2:abc","owner":"w1","lockTimeoutSeconds":5}`,
		`{"command":{"n":9007199254740993}}`, `{"command":{"operation":"x"}}`, `{"command":null}`, `{"command":[1]}`,
		`{"fencingToken":1,"fencingToken":2,"checkpoint":"X"}`, `{"fencingToken":1,"response":{"status":201,"headers":{"A":"b"},"body":"AAE="}}`,
		`{"fencingToken":1,"status":"FAILED_RETRYABLE","errorCode":"E"}`, "{\"command\":{\"s\":\"\xff\"}}", `{"Command":{}}`,
		`{"fencingToken":1,"response":{"status":201,"body":"!!"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var b coordapi.BeginRequest
		if err := strictjson.ClientError(strictjson.DecodeObject(body, &b)); err != nil {
			clientError(t, "begin body", err)
		} else if len(b.Command) > 0 {
			h1, err := commandHashes("op", b.Command)
			if err != nil {
				clientError(t, "command", err)
			} else {
				h2, err := commandHashes("op", b.Command)
				if err != nil || strings.Join(h1, ",") != strings.Join(h2, ",") || len(h1) != len(fingerprint.Versions()) ||
					fingerprint.VersionOf(h1[0]) != fingerprint.Version {
					t.Fatalf("command hashes not deterministic or versioned: %v %v %v", h1, h2, err)
				}
				cmd, err := fingerprint.ParseObject(b.Command)
				if err != nil {
					t.Fatalf("hashed command does not parse: %v", err)
				}
				canon, err := fingerprint.Canonical("op", cmd)
				if err != nil {
					t.Fatal(err)
				}
				// The canonical form holds "operation"; without it, it is
				// the same command.
				m, err := fingerprint.ParseObject(canon)
				if err != nil {
					t.Fatalf("canonical form %s does not parse: %v", canon, err)
				}
				delete(m, "operation")
				if h3, err := fingerprint.Hashes("op", m); err != nil || h3[0] != h1[0] {
					t.Fatalf("canonical form hashes %v (%v), want %s", h3, err, h1[0])
				}
			}
		}
		var c coordapi.CompleteRequest
		if err := strictjson.ClientError(strictjson.DecodeObject(body, &c)); err != nil {
			clientError(t, "complete body", err)
		} else if c.Response != nil {
			if _, err := responseFrom(c.Response); err != nil {
				clientError(t, "response", err)
			}
		}
		var fl coordapi.FailRequest
		if err := strictjson.ClientError(strictjson.DecodeObject(body, &fl)); err != nil {
			clientError(t, "fail body", err)
		}
		var cp coordapi.CheckpointRequest
		if err := strictjson.ClientError(strictjson.DecodeObject(body, &cp)); err != nil {
			clientError(t, "checkpoint body", err)
		}
	})
}

// FuzzRequestHash checks "v<N>:<hash>" parsing: an accepted hash has the
// version fingerprint.VersionOf reads, is visible ASCII and bounded.
func FuzzRequestHash(f *testing.F) {
	for _, s := range []string{"v1:abc", "v2:" + strings.Repeat("a", 64), "v0:x", "v:x", "v1:", "v01:x", "v99999:x", "x1:y", "v1:a b", "v1:\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		v, ok := parseRequestHash(h)
		if !ok {
			return
		}
		if v < 1 || v != fingerprint.VersionOf(h) || len(h) > maxRequestHashLen || !visibleASCII(h) {
			t.Fatalf("accepted %q as version %d (VersionOf %d)", h, v, fingerprint.VersionOf(h))
		}
	})
}

// FuzzPathParameters checks the checks made on path parameters before any
// SQL: whatever validOperation and idem.ValidKey accept is bounded visible
// ASCII (so never NUL, invalid UTF-8 or a control). Payment ids have their
// own (payments/paymentsnode).
func FuzzPathParameters(f *testing.F) {
	for _, s := range []string{"create_payment", "k1", "\x00", "\xff", "pay_0123", "a b", strings.Repeat("k", 256), "%00", "\u202e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, ok := range map[string]bool{"operation": idem.ValidOperation(s), "key": idem.ValidKey(s)} {
			if ok && (s == "" || len(s) > 255 || !visibleASCII(s)) {
				t.Fatalf("%s %q accepted", name, s)
			}
		}
	})
}
