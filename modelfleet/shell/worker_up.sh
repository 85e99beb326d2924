#!/bin/sh
# A headless pool worker has no endpoint: its unit must come up and stay up for SETTLE seconds
# (modelfleet.host.operations.service). Arguments: UNIT SETTLE. journal prints the unit's last lines.
unit=$1 settle=$2
for _ in $(seq "$settle"); do
  if systemctl is-failed --quiet "$unit"; then
    echo "modelfleet: worker $unit failed" >&2
    journal >&2
    exit 1
  fi
  sleep 1
done
systemctl is-active --quiet "$unit" || {
  echo "modelfleet: worker $unit is not active" >&2
  journal >&2
  exit 1
}
