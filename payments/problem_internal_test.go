package payments

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/idemhttp"
)

// TestPaymentAnswersAreProblems: the answers of the payments API that carry
// one of its codes and name a payment are RFC 9457 problems, as every other
// error of the node: the table's status, title and Retry-After, a type URI
// that is the code's documentation, detail and message alike, and the
// payment's id as an extension member.
func TestPaymentAnswersAreProblems(t *testing.T) {
	for _, tc := range []struct {
		code     string
		resp     idem.Response
		idMember string
	}{
		{ECodePaymentDeclined, problemResponse(ECodePaymentDeclined, "The payment provider declined the payment.", paymentProblem{PaymentID: "pay_1"}), "paymentId"},
		{ECodeProviderKeyConflict, providerKeyConflictResponse("pay_1"), "paymentId"},
		{ECodeDuplicateMerchantRef, duplicateResponse("pay_1"), "existingPaymentId"},
		{ECodeOutcomeUnknown, unknownResponse("pay_1"), "paymentId"},
	} {
		t.Run(tc.code, func(t *testing.T) {
			class := Errors[tc.code]
			if tc.resp.Status != class.Status {
				t.Errorf("status %d, want %d", tc.resp.Status, class.Status)
			}
			if ct := tc.resp.Headers["Content-Type"]; ct != idemhttp.ProblemContentType {
				t.Errorf("Content-Type %q, want %q", ct, idemhttp.ProblemContentType)
			}
			if ra, want := tc.resp.Headers["Retry-After"], class.RetryAfter; (ra != "") != (want > 0) || (want > 0 && ra != "1") {
				t.Errorf("Retry-After %q, want the class's %d", ra, want)
			}
			var body map[string]any
			if err := json.Unmarshal(tc.resp.Body, &body); err != nil {
				t.Fatalf("body %s: %v", tc.resp.Body, err)
			}
			want := map[string]any{
				"type": idemhttp.DefaultTypeBase + strings.ToLower(tc.code), "title": class.Title, "status": float64(class.Status),
				"errorCode": tc.code, tc.idMember: "pay_1",
			}
			for k, v := range want {
				if body[k] != v {
					t.Errorf("%s = %v, want %v (body %s)", k, body[k], v, tc.resp.Body)
				}
			}
			if d, m := body["detail"], body["message"]; d == nil || d == "" || d != m {
				t.Errorf("detail %v and message %v: want the same, non-empty", d, m)
			}
			if len(body) != 7 {
				t.Errorf("body has %d members, want 7: %s", len(body), tc.resp.Body)
			}
		})
	}
}
