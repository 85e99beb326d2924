#!/bin/sh
# The front door is ready only when every replica it routes to is (a router answers /health before its workers:
# SGLang #33740): from the router host, each URL given (a replica's health path, as the router reaches it) must
# answer 200 within TIMEOUT seconds in all; those that do not are named in one line (modelfleet.plan.router).
# Arguments: NAME (the front door) TIMEOUT, then HOST URL pairs.
set -f  # the pairs are split on spaces below, never globbed
name=$1 timeout=$2
shift 2
pending="$*"
for _ in $(seq "$timeout"); do
  left=""
  # shellcheck disable=SC2086
  set -- $pending
  while [ $# -ge 2 ]; do
    code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' "$2")
    if [ "$code" = 200 ]; then echo "ready $1 $2"; else left="$left $1 $2 $code"; fi
    shift 2
  done
  [ -z "$left" ] && exit 0
  pending=$(echo "$left" | awk '{for (i = 1; i <= NF; i += 3) printf "%s %s ", $i, $(i + 1)}')
  sleep 1
done
echo "$left" | awk -v name="$name" -v t="$timeout" '{s = ""; for (i = 1; i <= NF; i += 3)
  s = s (s ? ", " : "") $i " (" $(i + 1) " answered " ($(i + 2) == "000" ? "nothing" : $(i + 2)) ")"
  print "modelfleet: front door " name " degraded: replicas not ready after " t " s: " s}' >&2
exit 1
