package fingerprint_test

import (
	"fmt"

	"github.com/idemcoord/idem/fingerprint"
)

// Two bodies that the API treats as the same command, written differently
// (member order, spacing, 10.50 for 10.5), hash alike; a different amount
// does not. The transport's volatile field is removed before hashing.
func Example() {
	bodies := []string{
		`{"to": "acc_2", "amount": 10.50, "meta": {"sentAt": "2030-01-01T10:00:00Z"}}`,
		`{"amount":10.5,"to":"acc_2","meta":{"sentAt":"2030-01-01T10:00:07Z"}}`,
		`{"amount":10.51,"to":"acc_2","meta":{"sentAt":"2030-01-01T10:00:09Z"}}`,
	}
	var first string
	for i, body := range bodies {
		cmd, err := fingerprint.ParseObject([]byte(body)) // exact numbers, strict JSON
		if err != nil {
			panic(err)
		}
		fingerprint.Remove(cmd, "/meta/sentAt") // changes on every retry: not part of the command
		canonical, err := fingerprint.Canonical("create_transfer", cmd)
		if err != nil {
			panic(err)
		}
		hash, err := fingerprint.Hash("create_transfer", cmd)
		if err != nil {
			panic(err)
		}
		if i == 0 {
			first = hash
		}
		fmt.Printf("%s same=%t\n", canonical, hash == first)
	}
	fmt.Println(first) // "v<version>:" and the SHA-256 of the canonical form, in hex
	// Output:
	// {"amount":10.5,"meta":{},"operation":"create_transfer","to":"acc_2"} same=true
	// {"amount":10.5,"meta":{},"operation":"create_transfer","to":"acc_2"} same=true
	// {"amount":10.51,"meta":{},"operation":"create_transfer","to":"acc_2"} same=false
	// v2:1e2d597974b9072259c7a5b3399137cd568ed05dbfd3b35466c68afbe9dd6ab1
}

// A form-encoded body (what payment SDKs send) hashes by its fields, not
// their order; a repeated field keeps its values' order.
func ExampleParseForm() {
	var first string
	for i, body := range []string{
		"amount=1050&currency=eur&expand[]=customer&expand[]=invoice",
		"currency=eur&expand[]=customer&amount=1050&expand[]=invoice",
		"currency=eur&expand[]=invoice&amount=1050&expand[]=customer",
	} {
		pairs, err := fingerprint.ParseForm([]byte(body), nil)
		if err != nil {
			panic(err)
		}
		hash, err := fingerprint.Hash("create_charge", map[string]any{"form": pairs})
		if err != nil {
			panic(err)
		}
		if i == 0 {
			first = hash
		}
		fmt.Printf("%v same=%t\n", pairs, hash == first)
	}
	// Output:
	// [[amount 1050] [currency eur] [expand[] customer] [expand[] invoice]] same=true
	// [[amount 1050] [currency eur] [expand[] customer] [expand[] invoice]] same=true
	// [[amount 1050] [currency eur] [expand[] invoice] [expand[] customer]] same=false
}
