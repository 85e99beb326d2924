#!/bin/sh
# The filesystem on DEVICE mounted at MOUNT by its UUID through fstab, noatime (modelfleet.stages.storage); a
# line already in fstab for that UUID and a mount already there are kept. Arguments: DEVICE MOUNT FILESYSTEM.
device=$1 mount=$2 filesystem=$3
uuid=$(blkid -s UUID -o value "$device") && [ -n "$uuid" ] && mkdir -p "$mount" &&
  { grep -q "^UUID=$uuid " /etc/fstab || echo "UUID=$uuid $mount $filesystem noatime,nofail 0 2" >> /etc/fstab; } &&
  { mountpoint -q "$mount" || mount "$mount"; }
