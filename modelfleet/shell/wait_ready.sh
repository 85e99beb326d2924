#!/bin/sh
# An engine is ready when /health answers and /v1/models lists its served name (modelfleet.host.operations.service);
# a failed unit or the deadline stop the wait with the unit's journal on stderr. Arguments: UNIT BASE_URL
# SERVED_NAME TIMEOUT (seconds). health and models ask the endpoint, journal prints the unit's last lines.
unit=$1 base_url=$2 served_name=$3 timeout=$4
deadline=$(( $(date +%s) + timeout ))
while :; do
  if systemctl is-failed --quiet "$unit"; then
    echo "modelfleet: $unit failed (start limit reached or engine exited)" >&2
    journal >&2
    exit 1
  fi
  if health >/dev/null 2>&1 && models 2>/dev/null | grep -qF "\"$served_name\""; then
    echo "modelfleet: $unit ready at $base_url"
    exit 0
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "modelfleet: $unit not ready after $timeout s" >&2
    journal >&2
    exit 1
  fi
  sleep 1
done
