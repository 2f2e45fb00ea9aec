package idemhttp_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/idemcoord/idem/idemhttp"
)

func TestPreferWait(t *testing.T) {
	const limit = time.Minute
	none := time.Duration(-1) // no stated wait
	for _, c := range []struct {
		fields []string
		want   time.Duration
	}{
		{[]string{"wait=5"}, 5 * time.Second},
		{[]string{"wait=0"}, 0},
		{[]string{"wait=000"}, 0},
		{[]string{"wait=60"}, time.Minute},
		{[]string{"wait=61"}, limit},
		{[]string{"wait=99999999999999999999999999"}, limit},
		{[]string{"wait=9227000000"}, limit}, // would overflow a Duration
		{[]string{`wait="3"`}, 3 * time.Second},
		{[]string{`wait="\3"`}, 3 * time.Second}, // a quoted pair
		{[]string{"WAIT = 2"}, 2 * time.Second},
		{[]string{"\twait\t=\t2\t"}, 2 * time.Second},
		{[]string{"respond-async, wait=10"}, 10 * time.Second},
		{[]string{"respond-async; foo=bar, wait=10"}, 10 * time.Second},
		{[]string{`return=minimal; note="a, wait=1", wait=10`}, 10 * time.Second},
		{[]string{"wait=10;foo=bar"}, 10 * time.Second},
		{[]string{"wait=10 ; foo"}, 10 * time.Second},
		{[]string{",, wait=4 ,"}, 4 * time.Second},
		{[]string{"respond-async", "wait=7"}, 7 * time.Second},
		// Only the first wait counts, well-formed or not.
		{[]string{"wait=1, wait=9"}, time.Second},
		{[]string{"wait=1", "wait=9"}, time.Second},
		{[]string{"wait=x, wait=9"}, none},
		{[]string{"wait", "wait=9"}, none},
		// Not a wait.
		{nil, none},
		{[]string{""}, none},
		{[]string{"handling=lenient"}, none},
		{[]string{"waiting=5"}, none},
		{[]string{"no-wait=5"}, none},
		{[]string{`"wait=5"`}, none},
		{[]string{"wait"}, none},
		{[]string{"wait="}, none},
		{[]string{`wait=""`}, none},
		{[]string{"wait;x=5"}, none},
		{[]string{"wait=-1"}, none},
		{[]string{"wait=+5"}, none},
		{[]string{"wait=5.0"}, none},
		{[]string{"wait=0x10"}, none},
		{[]string{"wait=5s"}, none},
		{[]string{"wait=5 6"}, none},
		{[]string{`wait="5`}, none},
		{[]string{`wait="5"x`}, none},
		{[]string{"wait=\u0665"}, none}, // an Arabic-Indic five is no ASCII digit
	} {
		h := http.Header{}
		for _, f := range c.fields {
			h.Add("Prefer", f)
		}
		d, ok := idemhttp.PreferWait(h, limit)
		got := d
		if !ok {
			got = none
		}
		if got != c.want || (!ok && d != 0) {
			t.Errorf("PreferWait(%q) = %v, %v; want %v", c.fields, d, ok, c.want)
		}
	}
}

func TestPreferWaitLimit(t *testing.T) {
	h := http.Header{"Prefer": []string{"wait=2"}}
	for _, c := range []struct{ limit, want time.Duration }{
		{time.Minute, 2 * time.Second},
		{2 * time.Second, 2 * time.Second},
		{1500 * time.Millisecond, 1500 * time.Millisecond},
		{0, 0},
		{-time.Second, 0},
	} {
		if d, ok := idemhttp.PreferWait(h, c.limit); !ok || d != c.want {
			t.Errorf("PreferWait(wait=2, %v) = %v, %v; want %v, true", c.limit, d, ok, c.want)
		}
	}
}

// FuzzPreferWait: no Prefer value panics; a wait is within [0, limit] and
// whole seconds below it; a well-formed wait=N is min(N s, limit); what
// follows a stated wait, and a preference before it, change nothing.
func FuzzPreferWait(f *testing.F) {
	for _, s := range []string{"wait=5", "respond-async, wait=10", `wait="3"`, "WAIT = 2", "wait=-1", "wait=99999999999999999999",
		"wait", "handling=lenient", "", `a="b,wait=1", wait=2`, `wait="\`, "wait=1;x", "wait=0"} {
		f.Add(s, uint16(5))
	}
	const limit = time.Minute
	f.Fuzz(func(t *testing.T, v string, n uint16) {
		h := http.Header{"Prefer": []string{v}}
		d, ok := idemhttp.PreferWait(h, limit)
		if d < 0 || d > limit || (d < limit && d%time.Second != 0) || (!ok && d != 0) {
			t.Fatalf("PreferWait(%q) = %v, %v", v, d, ok)
		}
		if d2, ok2 := idemhttp.PreferWait(h, limit); d2 != d || ok2 != ok {
			t.Fatalf("PreferWait(%q) is not deterministic", v)
		}
		if ok {
			for _, after := range []http.Header{
				{"Prefer": []string{v + ", wait=7"}},
				{"Prefer": []string{v, "wait=7"}},
			} {
				if d2, ok2 := idemhttp.PreferWait(after, limit); d2 != d || !ok2 {
					t.Fatalf("PreferWait(%q) = %v, %v; a later wait changed it to %v, %v", after["Prefer"], d, ok, d2, ok2)
				}
			}
		}
		if d2, ok2 := idemhttp.PreferWait(http.Header{"Prefer": []string{"respond-async, " + v}}, limit); d2 != d || ok2 != ok {
			t.Fatalf("PreferWait(%q) = %v, %v; after respond-async %v, %v", v, d, ok, d2, ok2)
		}
		want := min(time.Duration(n)*time.Second, limit)
		if got, ok := idemhttp.PreferWait(http.Header{"Prefer": []string{"wait=" + strconv.Itoa(int(n))}}, limit); !ok || got != want {
			t.Fatalf("PreferWait(wait=%d) = %v, %v; want %v", n, got, ok, want)
		}
	})
}
