#!/bin/sh
# The verify gate's key-less probe of a front door's replicas, from the router host (modelfleet.plan.router): every
# URL given (a replica's address and a route that runs the model) is asked without the key, with BODY, and must
# answer 401 or 403; anything else (an answer, or none) is printed naming the replica's host and the route.
# Arguments: NAME (the front door) BODY, then HOST URL pairs.
name=$1 body=$2
shift 2
failed=0
while [ $# -ge 2 ]; do
  host=$1 url=$2
  shift 2
  code=$(curl -s -o /dev/null -m 10 -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d "$body" "$url")
  case "$code" in
    401|403) echo "refused $code $host $url" ;;
    000) echo "modelfleet: front door $name: replica on $host gave no answer at $url to a request without the key from the router host (want 401 or 403)" >&2; failed=1 ;;
    *) echo "modelfleet: front door $name: replica on $host answered $code at $url to a request without the key, from the router host (want 401 or 403): the model runs for anyone who reaches it" >&2; failed=1 ;;
  esac
done
exit "$failed"
