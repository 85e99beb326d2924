#!/bin/sh
# The filesystem on DEVICE mounted at MOUNT by its UUID through fstab, noatime and nosuid,nodev (engine containers
# write below it: modelfleet.run.stages.storage); a line already in fstab for that UUID is kept, with nosuid and nodev
# added where it lacks them, and a mount already there is remounted so. Arguments: DEVICE MOUNT FILESYSTEM.
# FLAGS (nosuid,nodev) comes from modelfleet.host.operations.mounts.
device=$1 mount=$2 filesystem=$3
uuid=$(blkid -s UUID -o value "$device") && [ -n "$uuid" ] && mkdir -p "$mount" &&
  { grep -q "^UUID=$uuid " /etc/fstab || echo "UUID=$uuid $mount $filesystem noatime,$FLAGS,nofail 0 2" >> /etc/fstab; } &&
  fstab=$(awk -v u="UUID=$uuid" -v flags="$FLAGS" '$1 == u { n = split(flags, f, ","); for (i = 1; i <= n; i++)
    if (("," $4 ",") !~ ("," f[i] ",")) $4 = $4 "," f[i] } { print }' /etc/fstab) &&
  { [ "$fstab" = "$(cat /etc/fstab)" ] || { tmp=$(mktemp /etc/fstab.modelfleet-XXXXXX) && printf '%s\n' "$fstab" > "$tmp" &&
    chmod 644 "$tmp" && mv -f "$tmp" /etc/fstab; }; } &&
  if mountpoint -q "$mount"; then mount -o "remount,$FLAGS" "$mount"; else mount "$mount"; fi
