package engine

import (
	"slices"

	"github.com/idemcoord/idem"
)

// fingerprints are what one request is compared with a record by: its raw
// hash (Request.RawHash, "" without one) and its request hashes, parsed
// at most once and only when something needs them (Request.Fingerprint).
type fingerprints struct {
	raw    string
	hashes []string
	parse  func() ([]string, error)
	err    error
}

// requestHashes returns the request hashes, parsing the command the first
// time.
func (f *fingerprints) requestHashes() ([]string, error) {
	if len(f.hashes) == 0 && f.parse != nil && f.err == nil {
		f.hashes, f.err = f.parse()
		f.parse = nil
	}
	if f.err != nil {
		return nil, f.err
	}
	if len(f.hashes) == 0 || f.hashes[0] == "" {
		return nil, errNoHash()
	}
	return f.hashes, nil
}

// sameCommand is the engine's rule for whether the request is the command
// that claimed a record whose raw hash is raw ("" if it has none) and
// whose request hash is hash: the same raw hash, told without parsing the
// request, or else one of its request hashes equal to hash, as idem.Decide
// compares them (a different serialisation of the same command is the same
// command; a different command is not).
//
// Equal raw hashes mean equal bytes and equal everything else the command
// is parsed from (fingerprint.RawHash), so equal commands. A raw hash
// always belongs to a request that parsed: a record's, or a kept answer's,
// comes from a request whose command was parsed and hashed before anything
// was claimed, so a body that does not parse never matches one and gets
// its own error from the parse below.
//
// The store decides by the request hashes alone (idem.Decide): by then the
// request was parsed for the claim's insert, and where the raw hashes are
// equal the request hashes are too, so both decide alike.
func (f *fingerprints) sameCommand(raw, hash string) (bool, error) {
	if f.raw != "" && f.raw == raw {
		return true, nil
	}
	hashes, err := f.requestHashes()
	if err != nil {
		return false, err
	}
	return slices.Contains(hashes, hash), nil
}

// keptRawHash is the raw hash an answer kept of rec is kept with: rec's
// own, or for a record stored without one (claimed before the column
// existed, or through a Coordinator that keeps none), the raw hash of
// begin's request, which the claim found to be rec's command by its
// request hashes.
func keptRawHash(rec *idem.Record, begin idem.BeginRequest) string {
	if rec != nil && rec.RawHash != "" {
		return rec.RawHash
	}
	return begin.RawHash
}
