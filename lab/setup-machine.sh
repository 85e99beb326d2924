#!/usr/bin/env bash
# Make this machine able to run the lab (Debian 12, root): Debian packages, then dockerd if none answers.
# containerd and runc (docker.io's) also run the dockerd with CDI that `lab up` gives the scenario's cdi hosts
# (lab/cdi.py: forky's docker.io, fetched into the lab state, never installed on the machine).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
for cmd in dockerd:docker.io containerd:containerd runc:runc mmdebstrap:mmdebstrap docker-registry:docker-registry \
           ssh-keygen:openssh-client make:make curl:curl \
           apt-ftparchive:apt-utils gpg:gnupg losetup:mount mkfs.ext4:e2fsprogs nft:nftables; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  # The daemon outlives this script: it keeps no descriptor but its log (a lock held by whoever ran
  # this, flock's for one, would stay held as long as dockerd runs).
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] && eval "exec $fd>&-"
    done
    exec nohup dockerd --storage-driver=overlay2 </dev/null >/var/log/modelfleet-dockerd.log 2>&1
  ) &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/modelfleet-dockerd.log" >&2; exit 1; }
fi
# Each lab host runs systemd, which takes several inotify instances: the kernel's default of 128 per user stops
# new hosts' units (sshd among them) at about 26 hosts; bench-converge runs 48.
if [ "$(cat /proc/sys/fs/inotify/max_user_instances)" -lt 8192 ]; then
  sysctl -q -w fs.inotify.max_user_instances=8192 || echo "warning: fs.inotify.max_user_instances stays low: labs of more than ~25 hosts will not start" >&2
fi
echo "lab prerequisites ready: $(docker version --format 'dockerd {{.Server.Version}}')"
