package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// RawPrefix starts every raw hash: "r1:" and 64 hex digits. A raw hash is
// never a request hash ("v1:", "v2:"): the two are never compared with
// each other.
const RawPrefix = "r1:"

// RawHash returns the raw hash of a request as it was received: SHA-256
// over the operation name, the named inputs (name, value, name, value,
// ...) and the body's bytes, each length-prefixed so that no two different
// inputs hash alike.
//
// It is a shortcut, not a fingerprint. Requests whose raw hashes are equal
// are the same command, with no parse, when inputs names everything a
// command is parsed from besides the body: path parameters, semantic
// headers (Api-Version), the media type, whatever else its parse reads.
// Then equal raw hashes mean equal inputs, and equal inputs parse to the
// same command under the same request hash. The converse does not hold:
// a different serialisation of the same command (members in another
// order, 10.0 for 10.00) has another raw hash, and only its request hash
// (Hashes) says it is the same command. An input a caller leaves out of
// inputs while its parse reads it would make two different commands look
// equal: every caller lists what its parse reads next to the parse.
//
// An input absent from a request is left out of inputs (a header not sent
// is not the header sent empty). inputs must come in pairs; a name alone
// at the end is hashed as a name with an empty value.
func RawHash(operation string, body []byte, inputs ...string) string {
	pairs := (len(inputs) + 1) / 2
	size := binary.MaxVarintLen64*(3+2*pairs) + len(operation) + len(body)
	for _, in := range inputs {
		size += len(in)
	}
	var sum [sha256.Size]byte
	if size <= rawBuffer {
		// Small requests (most) are hashed from one buffer on the stack.
		var buf [rawBuffer]byte
		sum = sha256.Sum256(append(appendRaw(buf[:0], operation, pairs, inputs, len(body)), body...))
	} else {
		h := sha256.New()
		h.Write(appendRaw(make([]byte, 0, size-len(body)), operation, pairs, inputs, len(body)))
		h.Write(body)
		h.Sum(sum[:0])
	}
	var out [len(RawPrefix) + 2*sha256.Size]byte
	copy(out[:], RawPrefix)
	hex.Encode(out[len(RawPrefix):], sum[:])
	return string(out[:])
}

// rawBuffer is the largest request RawHash hashes from the stack.
const rawBuffer = 1024

// appendRaw appends what RawHash hashes before the body's bytes: the
// operation, the number of pairs, each input, and the body's length, each
// but the count after its length.
func appendRaw(b []byte, operation string, pairs int, inputs []string, bodyLen int) []byte {
	b = binary.AppendUvarint(b, uint64(len(operation)))
	b = append(b, operation...)
	// With the number of pairs first, the sequence reads back one way
	// only.
	b = binary.AppendUvarint(b, uint64(pairs))
	for i := range 2 * pairs {
		v := ""
		if i < len(inputs) {
			v = inputs[i]
		}
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return binary.AppendUvarint(b, uint64(bodyLen))
}
