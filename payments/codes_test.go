package payments_test

import (
	"testing"

	"github.com/idemcoord/idem"
	"github.com/idemcoord/idem/payments"
)

// TestCodesAreTheAPIContract: the payments API's codes and checkpoints keep
// the exact values clients and stored records have always seen, now that
// they live in package payments; the engine's generic unknown-outcome code
// is a different one.
func TestCodesAreTheAPIContract(t *testing.T) {
	for got, want := range map[string]string{
		payments.ECodeOutcomeUnknown:                   "PAYMENT_OUTCOME_UNKNOWN",
		payments.ECodeDuplicateMerchantRef:             "DUPLICATE_MERCHANT_REFERENCE",
		payments.ECodeProviderKeyConflict:              "PROVIDER_KEY_CONFLICT",
		payments.ECodePaymentNotFound:                  "PAYMENT_NOT_FOUND",
		payments.ECodePaymentDeclined:                  "PAYMENT_DECLINED",
		payments.ECodeProviderUnavailable:              "PROVIDER_UNAVAILABLE",
		string(payments.CheckpointLocalPaymentCreated): "LOCAL_PAYMENT_CREATED",
		string(payments.CheckpointProviderRequestSent): "PROVIDER_REQUEST_SENT",
		string(payments.CheckpointProviderConfirmed):   "PROVIDER_CONFIRMED",
	} {
		if got != want {
			t.Errorf("code %s, want %s", got, want)
		}
	}
	if idem.ECodeOutcomeUnknown == payments.ECodeOutcomeUnknown {
		t.Errorf("the engine's unknown-outcome code is the payments API's %s", payments.ECodeOutcomeUnknown)
	}
	if len(payments.Errors) != 6 {
		t.Errorf("payments.Errors has %d codes, want 6", len(payments.Errors))
	}
}
