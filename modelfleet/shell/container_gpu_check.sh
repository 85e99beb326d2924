#!/bin/sh
# The GPUs a container sees must be the host's (modelfleet.run.stages.container_runtime): host_gpus lists the
# host's GPUs, container_gpus lists them from a container handed the GPUs as the engines get theirs.
h=$(host_gpus) && c=$(container_gpus) || exit 1
if [ "$h" != "$c" ]; then
  echo "host sees:"
  echo "$h"
  echo "a container sees:"
  echo "$c"
  exit 1
fi
echo "a container sees the host's GPUs"
