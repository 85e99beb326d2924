#!/bin/sh
# After the driver work (modelfleet.run.stages.gpu_driver): the GPUs answer at the wanted driver, and Fabric Manager
# matches the driver. Arguments: COUNT (the inventory's GPUs), WANTED (a driver version or a branch pattern,
# 580.*), FABRIC (non-empty: Fabric Manager must match). gpu_count, driver_version and fabric_manager_version
# come from modelfleet.base.host_commands.
count=$1 wanted=$2 fabric=$3
n=$(gpu_count) || { nvidia-smi; exit 1; }
[ "$n" -eq "$count" ] || { echo "nvidia-smi lists $n GPUs, inventory says $count"; exit 1; }
d=$(driver_version)
# shellcheck disable=SC2254 # WANTED is a pattern
case "$d" in
$wanted) ;;
*) echo "driver $d is not $wanted"; exit 1 ;;
esac
[ -z "$fabric" ] && exit 0
f=$(fabric_manager_version)
[ "$f" = "$d" ] || { echo "Fabric Manager $f does not match driver $d (CUDA error 802)"; exit 1; }
