#!/usr/bin/env bash
# The sidecar walkthrough: idemd in front of the example upstream makes
# POST /transfers idempotent. Start both first (see README.md), then:
#
#   IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=dev-token UPSTREAM_URL=http://127.0.0.1:9000 ./walkthrough.sh
#
# Each step prints what it sends and gets, and the script stops at the
# first answer that is not the expected one.
set -euo pipefail

IDEM_URL="${IDEM_URL:-http://127.0.0.1:8080}"
UPSTREAM_URL="${UPSTREAM_URL:-http://127.0.0.1:9000}"
: "${IDEM_TOKEN:?set IDEM_TOKEN to a bearer token of the node}"
key="order-$(date +%s)-$$"
auth="Authorization: Bearer ${IDEM_TOKEN}"

step() { printf '\n== %s\n' "$*"; }
expect() { # expect <what> <status> <file>
  local got
  got=$(head -n1 "$3" | awk '{print $2}')
  if [ "$got" != "$2" ]; then
    echo "FAIL: $1: status $got, want $2" >&2
    cat "$3" >&2
    exit 1
  fi
  echo "ok: $1 ($got)"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

executions() { curl -sS "$UPSTREAM_URL/stats" | sed -n 's/.*"executions":\([0-9]*\).*/\1/p'; }
before=$(executions)

step "1. a transfer with Idempotency-Key: $key (executes once, upstream sees a derived key)"
curl -sS -i -X POST "$IDEM_URL/transfers" -H "$auth" -H "Idempotency-Key: $key" \
  -H 'Content-Type: application/json' -d '{"amount":"10.00","to":"acc_2"}' | tr -d '\r' >"$tmp/first"
cat "$tmp/first"; echo
expect "first request" 201 "$tmp/first"

step "2. the client retries (member order and spacing do not matter): the stored answer, replayed"
curl -sS -i -X POST "$IDEM_URL/transfers" -H "$auth" -H "Idempotency-Key: $key" \
  -H 'Content-Type: application/json' -d '{ "to": "acc_2", "amount": "10.00" }' | tr -d '\r' >"$tmp/second"
cat "$tmp/second"; echo
expect "retry" 201 "$tmp/second"
grep -qi '^Idempotent-Replayed: true' "$tmp/second" || { echo "FAIL: the retry is not marked replayed" >&2; exit 1; }
[ "$(sed '1,/^$/d' "$tmp/first")" = "$(sed '1,/^$/d' "$tmp/second")" ] || { echo "FAIL: the replay differs from the first answer" >&2; exit 1; }
echo "ok: byte-identical replay"

step "3. the same key with another amount: refused, the upstream is not called"
curl -sS -i -X POST "$IDEM_URL/transfers" -H "$auth" -H "Idempotency-Key: $key" \
  -H 'Content-Type: application/json' -d '{"amount":"99.00","to":"acc_2"}' | tr -d '\r' >"$tmp/third"
cat "$tmp/third"; echo
expect "key reused" 409 "$tmp/third"
grep -q IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST "$tmp/third" || { echo "FAIL: want IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST" >&2; exit 1; }

step "4. no Idempotency-Key: refused"
curl -sS -i -X POST "$IDEM_URL/transfers" -H "$auth" \
  -H 'Content-Type: application/json' -d '{"amount":"10.00","to":"acc_2"}' | tr -d '\r' >"$tmp/fourth"
cat "$tmp/fourth"; echo
expect "missing key" 400 "$tmp/fourth"

step "5. the upstream executed the transfer once, under one derived key"
curl -sS "$UPSTREAM_URL/stats"
after=$(executions)
[ "$after" = "$((before + 1))" ] || { echo "FAIL: the upstream executed $((after - before)) times, want 1" >&2; exit 1; }
echo "ok: one execution"

step "6. the record, as the tenant sees it"
curl -sS "$IDEM_URL/v1/idempotency/records/create_transfer/$key" -H "$auth"
echo
echo
echo "walkthrough passed"
