#!/bin/sh
# A replica put into or taken out of a front door through the router's worker API (modelfleet.plan.router).
# Arguments: ACTION (add or remove) NAME (the front door) URL (the replica) WAIT (seconds). worker_call makes the
# call, list_workers prints the router's list.
action=$1 name=$2 url=$3 wait=$4
# A replica is added once it answers /health from the router host.
if [ "$action" = add ]; then
  for i in $(seq "$wait"); do
    curl -fsS -m 5 -o /dev/null "$url/health" && break
    [ "$i" = "$wait" ] && { echo "modelfleet: replica $url does not answer /health from the router host: not added to front door $name" >&2; exit 1; }
    sleep 1
  done
fi
worker_call >/dev/null || exit
# SGLang's router acts in the background: wait until its list has (or has lost) the replica.
for _ in $(seq "$wait"); do
  if list_workers | grep -qF "\"$url\""; then
    [ "$action" = add ] && exit 0
  else
    [ "$action" = remove ] && exit 0
  fi
  sleep 1
done
if [ "$action" = add ]; then
  echo "modelfleet: router $name does not list $url after $wait s" >&2
else
  echo "modelfleet: router $name still lists $url after $wait s" >&2
fi
exit 1
