// Package fingerprint computes request hashes: the stored memory of what the
// first command of a scoped key meant.
//
// The hash is a contract. A command is parsed and normalised by its operation
// (amounts to minor units, enum case, defaults filled in), transport metadata
// is dropped, and what remains (operation name, path parameters, semantic
// headers such as Api-Version, and the normalised fields) is serialised with
// RFC 8785 JSON canonicalisation and hashed with SHA-256. The result carries
// its version as a prefix ("v1:<hex>"); changing how a hash is computed is a
// new version, never an edit of an old one.
package fingerprint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/gowebpki/jcs"
)

// Version is the current hash version.
const Version = 1

// Hash returns the version-prefixed fingerprint of a normalised command:
// operation is the operation name, fields the normalised command (including
// path parameters and semantic headers, excluding Authorization and the
// idempotency key). fields must marshal to a JSON object.
func Hash(operation string, fields map[string]any) (string, error) {
	doc := make(map[string]any, len(fields)+1)
	for k, v := range fields {
		doc[k] = v
	}
	doc["operation"] = operation
	raw, err := json.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("fingerprint: marshal command: %w", err)
	}
	canonical, err := jcs.Transform(raw)
	if err != nil {
		return "", fmt.Errorf("fingerprint: canonicalise command: %w", err)
	}
	sum := sha256.Sum256(canonical)
	return fmt.Sprintf("v%d:%s", Version, hex.EncodeToString(sum[:])), nil
}

// Canonical returns the RFC 8785 form that Hash hashes, for diagnostics.
func Canonical(operation string, fields map[string]any) ([]byte, error) {
	doc := map[string]any{"operation": operation}
	for k, v := range fields {
		doc[k] = v
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("fingerprint: marshal command: %w", err)
	}
	return jcs.Transform(raw)
}
