#!/bin/sh
# One modelfleet run per host (modelfleet.runlock): take the lock LOCK or say who holds it ("busy <pid> <record>");
# then hold it, as this same process (exec: killing the recorded pid frees it), until stdin closes at the
# run's end. Arguments: LOCK HOLDER RECORD (the holder file, and this run's JSON record to write there).
lock=$1 holder=$2 record=$3
command -v flock >/dev/null || { echo 'no flock(1) on this host (util-linux)'; exit 0; }
mkdir -p "$(dirname "$lock")" 2>/dev/null
exec 9>>"$lock"
if ! flock -n 9; then
  echo "busy $(tr '\n' ' ' < "$holder" 2>/dev/null)"
  exit 0
fi
{ echo $$; printf '%s\n' "$record"; } > "$holder"
echo locked
exec cat >/dev/null
