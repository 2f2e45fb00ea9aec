package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemcoord/idem/engine"
	"github.com/idemcoord/idem/fingerprint"
	"github.com/idemcoord/idem/internal/storetest"
)

// BenchmarkAnswerCache measures, in one run over PostgreSQL, what Do costs
// for a fresh key (claim, Execute, completion), for a replay of a settled
// key read from the store (engine without the answer cache) and for the
// same replay from memory; and a replay from memory of a request whose
// body is parsed as JSON and fingerprinted (fingerprint.ParseObject,
// fingerprint.Hashes) when needed, without a raw hash (parsed every time,
// as every replay was before Request.RawHash) and with one (not parsed):
//
//	go test ./engine -run '^$' -bench BenchmarkAnswerCache -benchtime 3000x
func BenchmarkAnswerCache(b *testing.B) {
	st, _ := storetest.New(b)
	var c counting
	open := func(opts engine.Options) *engine.Engine {
		e := engine.New(st, opts)
		if err := e.Register(engine.Operation{Name: opName, Execute: c.execute, Window: time.Hour}); err != nil {
			b.Fatal(err)
		}
		return e
	}
	cached, plain := open(engine.Options{AnswerCache: engine.AnswerCache{Bytes: 64 << 20}}), open(engine.Options{})
	h := hashes(b, map[string]any{"amount": 1})
	ctx := context.Background()
	if _, err := plain.Do(ctx, request("replayed", h)); err != nil {
		b.Fatal(err)
	}
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := cached.Do(ctx, request(fmt.Sprint("fresh-", i), h)); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, run := range []struct {
		name string
		e    *engine.Engine
	}{{"replay/store", plain}, {"replay/memory", cached}} {
		e := run.e
		b.Run(run.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ans, err := e.Do(ctx, request("replayed", h)); err != nil || !ans.Replayed {
					b.Fatal(ans, err)
				}
			}
		})
	}
	body := []byte(`{"accountId":"acc_1","amount":"10.00","currency":"EUR","merchantReference":"parsed"}`)
	parsed := func(raw bool) engine.Request {
		req := request("parsed", nil)
		req.Fingerprint = func() ([]string, error) {
			doc, err := fingerprint.ParseObject(body)
			if err != nil {
				return nil, err
			}
			return fingerprint.Hashes(opName, doc)
		}
		if raw {
			req.RawHash = fingerprint.RawHash(opName, body)
		}
		return req
	}
	if _, err := plain.Do(ctx, parsed(true)); err != nil {
		b.Fatal(err)
	}
	for _, raw := range []bool{false, true} {
		name := map[bool]string{false: "replay/memory-parsed", true: "replay/memory-raw-hash"}[raw]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ans, err := cached.Do(ctx, parsed(raw)); err != nil || !ans.Replayed {
					b.Fatal(ans, err)
				}
			}
		})
	}
}
