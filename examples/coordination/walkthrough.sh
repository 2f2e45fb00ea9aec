#!/usr/bin/env bash
# The coordination API with curl: what a service in any language does to
# run one operation once per key. The node must declare the operation:
#
#   idemd --database-url ... --auth-tokens-file tokens --operations create_transfer
#   IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=dev-token ./walkthrough.sh
#
# Each step prints the call and the answer; the script stops at the first
# answer that is not the expected one.
set -euo pipefail

IDEM_URL="${IDEM_URL:-http://127.0.0.1:8080}"
OPERATION="${OPERATION:-create_transfer}"
: "${IDEM_TOKEN:?set IDEM_TOKEN to a bearer token of the node}"
key="walk-$(date +%s)-$$"
base="$IDEM_URL/v1/coordination/$OPERATION/$key"
auth="Authorization: Bearer ${IDEM_TOKEN}"
command='{"amount":"10.00","to":"acc_2"}'

call() { # call <METHOD> <url> [body]: prints the answer, sets $status and $body
  local out
  if [ $# -ge 3 ]; then
    echo "> $1 $2 $3"
    out=$(curl -sS -w '\n%{http_code}' -X "$1" "$2" -H "$auth" -H 'Content-Type: application/json' -d "$3")
  else
    echo "> $1 $2"
    out=$(curl -sS -w '\n%{http_code}' -X "$1" "$2" -H "$auth")
  fi
  status=$(tail -n1 <<<"$out")
  body=$(sed '$d' <<<"$out")
  echo "< $status $body"
}
want() { # want <what> <status> [text the body must contain]
  if [ "$status" != "$2" ] || { [ $# -ge 3 ] && ! grep -qF -- "$3" <<<"$body"; }; then
    echo "FAIL: $1: got $status $body, want $2 ${3:-}" >&2
    exit 1
  fi
  echo "ok: $1"
}
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p" <<<"$body"; }

echo "== 1. begin: the first caller owns the key (outcome execute) and gets a fencing token"
# claimId: drawn at random once per request, so that the begin can be sent
# again if its answer is lost.
claim=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
call POST "$base/begin" "{\"command\":$command,\"claimId\":\"$claim\"}"
want "begin" 200 '"outcome":"execute"'
token=$(field fencingToken)

echo "== 1b. the begin's answer was lost: the same begin, same claimId, gets the claim back"
call POST "$base/begin" "{\"command\":$command,\"claimId\":\"$claim\"}"
want "begin again" 200 "\"fencingToken\":$token"

echo "== 2. a concurrent duplicate begins: in progress, with Retry-After"
call POST "$base/begin" "{\"command\":$command}"
want "duplicate while running" 200 '"outcome":"in_progress"'

echo "== 3. the owner does the work, then checkpoints and completes with its token"
call POST "$base/checkpoint" "{\"fencingToken\":$token,\"checkpoint\":\"TRANSFER_SENT\"}"
want "checkpoint" 204
answer=$(printf '{"id":"tr_1","amount":"10.00"}' | base64 | tr -d '\n')
call POST "$base/complete" "{\"fencingToken\":$token,\"response\":{\"status\":201,\"headers\":{\"Content-Type\":\"application/json\"},\"body\":\"$answer\"},\"resourceType\":\"transfer\",\"resourceId\":\"tr_1\"}"
want "complete" 204

echo "== 4. a retry begins: replay, with the stored answer (body in base64)"
call POST "$base/begin" "{\"command\":{\"to\":\"acc_2\",\"amount\":\"10.00\"}}"
want "retry" 200 '"outcome":"replay"'
grep -qF "$answer" <<<"$body" || { echo "FAIL: the replay does not carry the stored body" >&2; exit 1; }

echo "== 5. the same key with another command: conflict"
call POST "$base/begin" '{"command":{"amount":"99.00","to":"acc_2"}}'
want "other command" 200 '"outcome":"conflict"'

echo "== 6. a stale token cannot write"
call POST "$base/complete" "{\"fencingToken\":$((token + 1)),\"response\":{\"status\":201,\"headers\":{},\"body\":\"\"}}"
want "stale token" 409 FENCING_TOKEN_STALE

echo "== 7. the record and its answer"
call GET "$base"
want "get" 200 '"COMPLETED"'

echo
echo "walkthrough passed"
