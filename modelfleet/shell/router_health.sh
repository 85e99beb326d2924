#!/bin/sh
# The front door NAME answers URL (its /health on the router host) within TIMEOUT seconds (modelfleet.plan.router).
# Arguments: NAME URL TIMEOUT.
name=$1 url=$2 timeout=$3
for _ in $(seq "$timeout"); do
  curl -fsS -m 5 -o /dev/null "$url" && exit 0
  sleep 1
done
echo "modelfleet: router $name does not answer $url" >&2
exit 1
