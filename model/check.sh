#!/usr/bin/env bash
# Checks the protocol models with SPIN: every correct model must pass and
# every broken variant must be refuted (SPIN finds a counterexample). Prints,
# per run, the states stored, the depth reached, the time and the verdict;
# exits 1 when a correct model fails (or its search is cut short) or a broken
# variant passes. Needs spin and a C compiler (Debian: apt-get install spin
# gcc). Generated files (pan, pan.*, trails) live in a temporary directory;
# KEEP=DIR keeps them there instead (a variant's trail replays with
# `spin -t -p -DVARIANT model/NAME.pml` run in DIR).
set -euo pipefail
cd "$(dirname "$0")"

for tool in spin cc; do
  command -v "$tool" >/dev/null 2>&1 || { echo "check.sh: $tool is missing (apt-get install spin gcc)" >&2; exit 2; }
done

# Bounds of every run: the state vector, the search depth, the hash table
# (2^W slots) and the wall-clock limit of one run: it only stops a search
# that runs away, so it is set far above the minute the longest run takes
# on a quiet machine (a loaded one takes several times longer).
VECTORSZ=1024
DEPTH=200000
W=24
LIMIT=${LIMIT:-1200}
# Runs at once (each is one process; 2 cores run two).
JOBS=${JOBS:-2}

work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

total_start=$(date +%s.%N)
names=()

# check NAME MODEL KIND EXPECT DEFINES...
#   KIND   safety (assertions, invalid end states) or ltl (the model's ltl
#          property, weak fairness, acceptance cycles)
#   EXPECT pass (a correct model) or fail (a broken variant)
check() {
  local name=$1 model=$2 kind=$3 expect=$4; shift 4
  local dir="$work/$name"
  rm -rf "$dir"; mkdir -p "$dir"
  cp "$model.pml" "$dir/"
  local cflags=(-O2 -DVECTORSZ=$VECTORSZ) pflags=(-m$DEPTH -w$W)
  if [ "$kind" = safety ]; then
    cflags+=(-DSAFETY -DNOCLAIM -DCOLLAPSE)
  else
    # weak fairness over every process; the single-key model's requests
    # are rendezvous, with which partial order reduction and fairness do
    # not combine
    cflags+=(-DNFAIR=3 -DCOLLAPSE)
    [ "$model" = single_key ] && cflags+=(-DNOREDUCE)
    pflags+=(-a -f)
  fi
  local out rc=0 start end
  start=$(date +%s.%N)
  out=$( cd "$dir" && spin "$@" -a "$model.pml" >spin.out 2>&1 &&
         cc "${cflags[@]}" -o pan pan.c >cc.out 2>&1 &&
         timeout "$LIMIT" ./pan "${pflags[@]}" 2>&1 ) || rc=$?
  end=$(date +%s.%N)
  local errors states depth secs verdict detail=""
  errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out" | tail -1)
  states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' <<<"$out" | tail -1)
  depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' <<<"$out" | tail -1)
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1fs", b - a }')
  local ok=0
  if [ -z "$errors" ]; then
    verdict="ERROR (no verdict: exit $rc; KEEP=DIR keeps spin.out and cc.out)"
  elif grep -q 'max search depth too small\|Search not completed' <<<"$out" && [ "$errors" = 0 ]; then
    verdict="FAIL (search cut short)"
  elif [ "$expect" = pass ] && [ "$errors" = 0 ]; then
    verdict="PASS"; ok=1
  elif [ "$expect" = fail ] && [ "$errors" != 0 ]; then
    verdict="REFUTED (as it must be)"; ok=1
    detail=$(grep -m1 '^pan:1:' <<<"$out" || true)
  elif [ "$expect" = pass ]; then
    verdict="FAIL"
    detail=$(grep -m1 '^pan:1:' <<<"$out" || true)
  else
    verdict="FAIL (a broken variant passed)"
  fi
  {
    printf '%-44s %-6s %12s %7s %8s  %s\n' "$name" "$expect" "${states:--}" "${depth:--}" "$secs" "$verdict"
    [ -z "$detail" ] || printf '    %s\n' "$detail"
  } >"$work/$name.result"
  [ "$ok" = 1 ] || touch "$work/$name.failed"
}

# run queues a check, JOBS at a time.
run() {
  names+=("$1")
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  check "$@" &
}

# The correct models. single_key: 2 clients with one command and 1 with
# another, 2 nodes, up to 3 calls each, one window end, one fault; then 2
# clients, two faults, no window end; liveness with 2 clients, one fault.
run single_key                 single_key safety pass
run single_key.two-faults      single_key safety pass -DNREUSE=0 -DMAXFAULT=2 -DMAXEXP=0
run single_key.settled         single_key ltl    pass -DLIVENESS -DNREUSE=0
run failover                   failover   safety pass
run failover.answered          failover   ltl    pass -DLIVENESS

# The deliberately broken modes of the chaos harness (--break).
run single_key.FIND_THEN_INSERT single_key safety fail -DFIND_THEN_INSERT
run single_key.NO_FENCING       single_key safety fail -DNO_FENCING
run single_key.RAW_BODY_HASH    single_key safety fail -DRAW_BODY_HASH
# The failover's rules, each dropped.
run failover.EARLY_FAILOVER     failover   safety fail -DEARLY_FAILOVER
run failover.NO_LOCAL_DEADLINE  failover   safety fail -DNO_LOCAL_DEADLINE
run failover.NO_CATCHUP         failover   safety fail -DNO_CATCHUP
# Bugs of docs/chaos-history.md's table: 2, 3 and 5.
run failover.KEY_DERIVED_ID     failover   safety fail -DKEY_DERIVED_ID
run failover.REGIONAL_EFFECTS   failover   safety fail -DREGIONAL_EFFECTS
run failover.FAILOVER_GIVES_UP  failover   ltl    fail -DLIVENESS -DFAILOVER_GIVES_UP

wait
printf '%-44s %-6s %12s %7s %8s  %s\n' run expect states depth time verdict
failed=0
for name in "${names[@]}"; do
  cat "$work/$name.result" 2>/dev/null || { echo "$name: no result"; failed=1; }
  [ ! -e "$work/$name.failed" ] || failed=1
done
total_end=$(date +%s.%N)
awk -v a="$total_start" -v b="$total_end" 'BEGIN { printf "total %.1fs\n", b - a }'
if [ "$failed" != 0 ]; then
  echo "check.sh: FAILED"
  exit 1
fi
echo "check.sh: every correct model passes, every broken variant is refuted"
