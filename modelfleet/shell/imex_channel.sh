#!/bin/sh
# IMEX channel0 made with the major the loaded NVIDIA driver registered for DEVICE in /proc/devices (it can differ
# between nodes) (modelfleet.run.stages.imex). Arguments: DEVICE (the driver's name for it) CHANNEL (the node's path).
device=$1 channel=$2
m=$(awk -v d="$device" '$2 == d {print $1}' /proc/devices)
[ -n "$m" ] || { echo "modelfleet: the loaded NVIDIA driver registers no $device device (/proc/devices): is the NVIDIA driver loaded?" >&2; exit 1; }
mkdir -p "$(dirname "$channel")" && mknod -m 666 "$channel" c "$m" 0
