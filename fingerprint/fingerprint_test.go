package fingerprint

import (
	"cmp"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/gowebpki/jcs"
)

func TestHashIsOrderIndependentAndVersioned(t *testing.T) {
	a, err := Hash("create_payment", map[string]any{"amountMinor": 1000, "currency": "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Hash("create_payment", map[string]any{"currency": "EUR", "amountMinor": 1000})
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Errorf("Hash depends on map order: %s != %s", a, b)
	}
	if !strings.HasPrefix(a, "v2:") || len(a) != len("v2:")+64 || VersionOf(a) != Version {
		t.Errorf("Hash = %q, want v2: prefix and 64 hex digits", a)
	}
	c, _ := Hash("create_refund", map[string]any{"amountMinor": 1000, "currency": "EUR"})
	if c == a {
		t.Error("operation name is not part of the hash")
	}
	d, _ := Hash("create_payment", map[string]any{"amountMinor": 10000, "currency": "EUR"})
	if d == a {
		t.Error("a different amount hashes the same")
	}
}

func TestCanonicalIsRFC8785(t *testing.T) {
	got, err := Canonical("op", map[string]any{"b": "x", "a": 1.0, "c": []any{"é", 2}})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"a":1,"b":"x","c":["é",2],"operation":"op"}`
	if string(got) != want {
		t.Errorf("Canonical = %s, want %s", got, want)
	}
}

// goldenCommands pins the hash: a change to any of these values is a change
// of the contract, which must be a new version (see the package doc). The v1
// values are those of the version 1 code as it was before version 2 existed;
// where a document has no integer beyond 2^53, v2 hashes the same bytes.
var goldenCommands = []struct {
	name      string
	operation string
	fields    map[string]any
	v1, v2    string
}{
	{
		name:      "payment",
		operation: "create_payment",
		fields: map[string]any{"apiVersion": "2026-05-01", "accountId": "acc_1", "amountMinor": int64(1000),
			"currency": "EUR", "merchantReference": "invoice-7781", "channel": "web"},
		v1: "v1:b08d40daf34d6c2ff9207fc46f7ed2959f1ae7619eec43c392b6b9911314dc75",
		v2: "v2:b08d40daf34d6c2ff9207fc46f7ed2959f1ae7619eec43c392b6b9911314dc75",
	},
	{
		name:      "payment at 2^53+1 minor units",
		operation: "create_payment",
		fields: map[string]any{"apiVersion": "2026-05-01", "accountId": "acc_1", "amountMinor": int64(1<<53 + 1),
			"currency": "EUR", "merchantReference": "r", "channel": "web"},
		v1: "v1:dcd0957d4c9db12b374727c4bb038c307538e5b1beb119a3f2b44042180e63ae",
		v2: "v2:3aa876e96a0d47c6a82bb842b247155fce2f98b0f463771fdd3bbccccd5624fd",
	},
	{
		name:      "payment of 999999999999999.99",
		operation: "create_payment",
		fields: map[string]any{"apiVersion": "2026-05-01", "accountId": "acc_1", "amountMinor": int64(99999999999999999),
			"currency": "EUR", "merchantReference": "r", "channel": "web"},
		v1: "v1:0c930490e3a337adba8e22f8538c60085841328085a5d4fd63199665899a902f",
		v2: "v2:cac7451bdf2acef8b33d6cc5087e72c7f4f7232dedcce789c0ecbd0c88845ba9",
	},
	{
		name:      "payment of 999999999999999.98",
		operation: "create_payment",
		fields: map[string]any{"apiVersion": "2026-05-01", "accountId": "acc_1", "amountMinor": int64(99999999999999998),
			"currency": "EUR", "merchantReference": "r", "channel": "web"},
		v1: "v1:0c930490e3a337adba8e22f8538c60085841328085a5d4fd63199665899a902f",
		v2: "v2:9f3215b64d9781a387eb5a86f279dc4285bc2a0ee1ff95aa11c5738b2db2cdf6",
	},
	{
		name:      "client command",
		operation: "charge",
		fields: map[string]any{"amount": Number("10.50"), "big": Number("9007199254740992"), "currency": "EUR",
			"tags": []any{"a", "é", "\u20ac", "\U0001F600", "\n\u001f"}, "nested": map[string]any{"z": nil, "a": true, "\u00e9": false}},
		v1: "v1:9f835360513e05071230da3895cb7f88dc73e05186be70793851b3d2c3bdb0e7",
		v2: "v2:9f835360513e05071230da3895cb7f88dc73e05186be70793851b3d2c3bdb0e7",
	},
	{
		name:      "empty",
		operation: "op",
		fields:    map[string]any{},
		v1:        "v1:c7b2b4f391da589afe6e931998d6cb6ab913d4c62d923f7eca4722c9e79493c8",
		v2:        "v2:c7b2b4f391da589afe6e931998d6cb6ab913d4c62d923f7eca4722c9e79493c8",
	},
}

func TestGoldenHashes(t *testing.T) {
	for _, tc := range goldenCommands {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Hashes(tc.operation, tc.fields)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || got[0] != tc.v2 || got[1] != tc.v1 {
				t.Errorf("Hashes = %q, want [%s %s]", got, tc.v2, tc.v1)
			}
		})
	}
}

func TestV2TellsLargeIntegersApart(t *testing.T) {
	a, b := goldenCommands[2], goldenCommands[3]
	if a.v1 != b.v1 {
		t.Errorf("v1 is expected to confuse %s and %s (it reads numbers as doubles)", a.name, b.name)
	}
	if a.v2 == b.v2 {
		t.Errorf("v2 hashes %s and %s alike", a.name, b.name)
	}
	for _, n := range []int64{1<<53 - 1, 1 << 53, 1<<53 + 1, math.MaxInt64, math.MinInt64} {
		c, err := Canonical("op", map[string]any{"n": n, "u": uint64(math.MaxUint64)})
		if err != nil {
			t.Fatal(err)
		}
		want := `{"n":` + itoa(n) + `,"operation":"op","u":18446744073709551615}`
		if string(c) != want {
			t.Errorf("Canonical = %s, want %s", c, want)
		}
	}
}

// TestHashesTakesV1FromV2OnlyWhereExact checks Hashes' shortcut against
// the whole version 1 computation (encoding/json, then gowebpki/jcs): the
// same hash wherever it takes the shortcut, and the rounded one for Go
// integers beyond 2^53, nested or not.
func TestHashesTakesV1FromV2OnlyWhereExact(t *testing.T) {
	for _, n := range []any{int64(1<<53 - 1), int64(1 << 53), int64(-1 << 53), int64(1<<53 + 1), int64(-1<<53 - 1),
		math.MaxInt64, math.MinInt64, 1<<53 + 1, uint64(1 << 53), uint64(1<<53 + 1), uint(1<<53 + 1), int32(math.MaxInt32),
		uint32(math.MaxUint32), int8(-8), uint16(7), 0.1, 1e21, Number("10.50"), Number("1e3"), "\u2028<&>", true, nil} {
		for _, fields := range []map[string]any{
			{"n": n},
			{"a": []any{"x", map[string]any{"n": n}}},
			{"m": map[string]any{"\U0001F600": n, "\uFFFF": 1}},
		} {
			got, err := Hashes("op", fields)
			if err != nil {
				t.Fatalf("Hashes(%v): %v", fields, err)
			}
			want, err := HashVersion(1, "op", fields)
			if err != nil {
				t.Fatal(err)
			}
			if got[1] != want {
				t.Errorf("Hashes(%v)[1] = %s, want the whole v1 computation's %s", fields, got[1], want)
			}
			if exact := exactInV1(fields); exact != (got[0][3:] == got[1][3:]) {
				t.Errorf("exactInV1(%v) = %v, but v2 %s and v1 %s", fields, exact, got[0], got[1])
			}
		}
	}
}

func TestCompareUTF16(t *testing.T) {
	// RFC 8785 3.2.3's order: by UTF-16 code units, where a supplementary
	// character (a surrogate pair, 0xD83D...) sorts below U+E000..U+FFFF.
	ordered := []string{"", "\r", "1", "a", "ab", "\u00e9", "\u20ac", "\U0001F600", "\U0001F600a", "\U0001F601", "\ue000", "\uffff"}
	for i, a := range ordered {
		for j, b := range ordered {
			if got, want := compareUTF16(a, b), cmp.Compare(i, j); got != want {
				t.Errorf("compareUTF16(%q, %q) = %d, want %d", a, b, got, want)
			}
			if got, want := compareUTF16(a, b), slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b))); got != want {
				t.Errorf("compareUTF16(%q, %q) = %d, but the UTF-16 encodings compare %d", a, b, got, want)
			}
		}
	}
}

// TestCompareUTF16Random checks compareUTF16's bytewise shortcut against
// the UTF-16 encodings of strings drawn from the ranges where the orders
// part: ASCII, two- and three-byte runes below U+E000, U+E000..U+FFFF, and
// runes beyond the BMP, after common prefixes of every kind.
func TestCompareUTF16Random(t *testing.T) {
	pool := []rune{'a', 'b', 0x7f, 0xe9, 0x7ff, 0x800, 0x20ac, 0xd7ff, 0xe000, 0xefff, 0xf000, 0xffff, 0x10000, 0x1f600, 0x10ffff}
	r := rand.New(rand.NewPCG(1, 2))
	str := func() string {
		n := r.IntN(4)
		rs := make([]rune, n)
		for i := range rs {
			rs[i] = pool[r.IntN(len(pool))]
		}
		return string(rs)
	}
	for range 20000 {
		prefix := str()
		a, b := prefix+str(), prefix+str()
		if got, want := compareUTF16(a, b), slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b))); got != want {
			t.Fatalf("compareUTF16(%q, %q) = %d, but the UTF-16 encodings compare %d", a, b, got, want)
		}
	}
}

func itoa(n int64) string {
	c, _ := appendValue(nil, n)
	return string(c)
}

func TestCanonicalAgreesWithHashOnOperation(t *testing.T) {
	fields := map[string]any{"operation": "other", "a": 1}
	if _, err := Canonical("op", fields); !errors.Is(err, ErrReservedName) {
		t.Errorf("Canonical with an operation field: err = %v, want ErrReservedName", err)
	}
	if _, err := Hash("op", fields); !errors.Is(err, ErrReservedName) {
		t.Errorf("Hash with an operation field: err = %v, want ErrReservedName", err)
	}
}

func TestV2RejectsWhatItCannotKeepExact(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		err  error
	}{
		{"invalid utf-8 string", "a\xffb", ErrInvalidUTF8},
		{"invalid utf-8 name", map[string]any{"\xff": 1}, ErrInvalidUTF8},
		{"beyond 2^53 as a literal", Number("9007199254740993"), ErrInexactNumber},
		{"more digits than a double", Number("0.10000000000000001"), ErrInexactNumber},
		{"overflow", Number("1e400"), ErrInexactNumber},
		{"underflow", Number("1e-400"), ErrInexactNumber},
		{"NaN", math.NaN(), ErrInexactNumber},
		{"float32", float32(1), ErrUnsupportedType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Hash("op", map[string]any{"v": tc.v})
			if !errors.Is(err, tc.err) {
				t.Errorf("err = %v, want %v", err, tc.err)
			}
		})
	}
}

func TestNumbersOfOneValueHashAlike(t *testing.T) {
	for _, group := range [][]string{
		{"10.5", "10.50", "1.05e1", "105E-1", "10.500000"},
		{"0", "-0", "0.0", "0e10"},
		{"1000", "1e3", "1E+3", "1000.0"},
		{"0.1", "1e-1"},
		{"9007199254740992", "9.007199254740992e15"},
	} {
		want, err := Hash("op", map[string]any{"n": Number(group[0])})
		if err != nil {
			t.Fatal(err)
		}
		for _, lit := range group[1:] {
			if got, err := Hash("op", map[string]any{"n": Number(lit)}); err != nil || got != want {
				t.Errorf("%s hashes %s (err %v), %s hashes %s", lit, got, err, group[0], want)
			}
		}
	}
}

func TestParseObject(t *testing.T) {
	m, err := ParseObject([]byte(`{"a":[1,2.50,{"b":null}],"s":"x","t":true}`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Canonical("op", m)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":[1,2.5,{"b":null}],"operation":"op","s":"x","t":true}`; string(c) != want {
		t.Errorf("Canonical = %s, want %s", c, want)
	}
	for _, in := range []string{`{"a":1,"a":2}`, "{\"a\":\"\xff\"}", `{"a":9007199254740993}`, `[1]`, `{} 1`} {
		if _, err := ParseObject([]byte(in)); err == nil {
			t.Errorf("ParseObject(%s) accepted", in)
		}
	}
}

// FuzzCanonical checks, for every object ParseObject accepts, that hashing
// is deterministic, that the v2 form is RFC 8785 (gowebpki/jcs gives the same
// bytes, since accepted numbers are exact) and a fixed point (parsing the
// canonical form and canonicalising again changes nothing), that v1 hashed
// the same bytes, and that ParseObject never panics.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{
		`{"amount":"10.00","currency":"EUR"}`, `{"a":[1,2.50,{"b":null}],"s":"x","t":true}`,
		`{"n":9007199254740993}`, `{"n":1e400}`, `{"n":-0}`, `{"s":"\u0000\u001f\"\\\/"}`,
		`{"\u00e9":1,"e":2,"\ud83d\ude00":3,"\uffff":4}`, `{"a":1,"a":2}`, "{\"a\":\"\xff\"}",
		`{"operation":"x"}`, `{"n":0.1}`, `{"n":1E-7}`, `{"n":123456789012345678901234567890}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ParseObject(in)
		if err != nil {
			return
		}
		delete(m, "operation")
		c1, err := Canonical("op", m)
		if err != nil {
			t.Fatalf("accepted object does not canonicalise: %v", err)
		}
		ref, err := jcs.Transform(c1)
		if err != nil || string(ref) != string(c1) {
			t.Fatalf("v2 form %s is not RFC 8785 (jcs: %s, %v)", c1, ref, err)
		}
		m2, err := ParseObject(c1)
		if err != nil {
			t.Fatalf("canonical form %s does not parse: %v", c1, err)
		}
		delete(m2, "operation")
		c2, err := Canonical("op", m2)
		if err != nil || string(c2) != string(c1) {
			t.Fatalf("canonical form is not a fixed point: %s -> %s (%v)", c1, c2, err)
		}
		h1, err1 := Hashes("op", m)
		h2, err2 := Hashes("op", m2)
		if err1 != nil || err2 != nil || len(h1) != 2 || h1[0] != h2[0] || h1[1] != h2[1] {
			t.Fatalf("hashes differ: %v %v (%v, %v)", h1, h2, err1, err2)
		}
		// A client object holds no Go integers, and its numbers are exact
		// doubles: v1 read it without loss, so both versions hash the same
		// bytes and a v1 record compares exactly.
		if h1[0][len("v2:"):] != h1[1][len("v1:"):] {
			t.Fatalf("v1 and v2 hash %s differently: %v", c1, h1)
		}
		// Hashes takes that v1 hash from v2's: the whole v1
		// computation agrees.
		if v1, err := HashVersion(1, "op", m); err != nil || v1 != h1[1] {
			t.Fatalf("Hashes' v1 %s, the whole v1 computation %s (%v)", h1[1], v1, err)
		}
	})
}

func TestEquivalent(t *testing.T) {
	x := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		h    string
		want []string
	}{
		{"v2:" + x, []string{"v2:" + x, "v1:" + x}},
		{"v1:" + x, []string{"v1:" + x}},
		{"v3:" + x, []string{"v3:" + x}},
		{"v02:" + x, []string{"v02:" + x}},
		{"raw:" + x, []string{"raw:" + x}},
	} {
		if got := Equivalent(tc.h); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("Equivalent(%s) = %v, want %v", tc.h, got, tc.want)
		}
	}
	// What Equivalent relies on: for the golden commands v1 hashed exactly,
	// the v1 hash is the v2 hash under the old prefix.
	for _, tc := range goldenCommands {
		if tc.name == "payment at 2^53+1 minor units" || strings.HasPrefix(tc.name, "payment of 9") {
			continue
		}
		if eq := Equivalent(tc.v2); eq[1] != tc.v1 {
			t.Errorf("%s: Equivalent(%s) = %v, want v1 %s", tc.name, tc.v2, eq, tc.v1)
		}
	}
}
