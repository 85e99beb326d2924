#!/bin/sh
# The verify gate's look at a front door's router port (modelfleet.plan.router.worker_guard_script), on the router
# host: the router's own user gets the worker list; a process of user nobody must get its connection refused.
# Arguments: NAME (the front door) URL (the router's worker list on loopback) ROUTER_USER UNIT (the router's).
name=$1 url=$2 router_user=$3 unit=$4
if ! setpriv --reuid="$router_user" --regid="$router_user" --clear-groups -- curl -fsS -m 5 -o /dev/null "$url"; then
  echo "modelfleet: front door $name: the router's user $router_user gets no answer from $url" >&2
  exit 1
fi
code=$(setpriv --reuid=65534 --regid=65534 --clear-groups -- curl -sS -m 5 -o /dev/null -w '%{http_code}' "$url" 2>/dev/null)
rc=$?
# curl's 7: the connection was refused (the owner rule's reset).
if [ "$rc" = 7 ]; then
  echo "refused nobody $url"
  exit 0
fi
echo "modelfleet: front door $name: a process of user nobody got ${code:-no refusal (curl exit $rc)} from the router's worker API $url (want the connection refused): any local process can register a worker; is its owner rule loaded? (nft list table inet $unit; restarting $unit.service loads it)" >&2
exit 1
