#!/bin/sh
# The host's network and RDMA view in "$MARK <section>" sections, read by modelfleet.host.facts.fabric.parse_fabric
# (modelfleet.base.host_commands.fabric_command says what each holds). Set by the caller: MARK, MODULES (the RDMA
# and NVIDIA modules to list, as an extended regular expression's alternatives), ZERO_GID (a GID slot not in use).
if ip -j addr >/dev/null 2>&1; then
  echo "$MARK ip-addr"; ip -j addr
  echo "$MARK ip-route"; ip -j route
  echo "$MARK ip-route6"; ip -j -6 route
else
  echo "$MARK proc-route"; cat /proc/net/route
  echo "$MARK proc-route6"; cat /proc/net/ipv6_route
  echo "$MARK fib-trie"; cat /proc/net/fib_trie
  echo "$MARK if-inet6"; cat /proc/net/if_inet6
fi
echo "$MARK links"
ls -l /sys/class/net/ /sys/class/infiniband/ /sys/class/infiniband_verbs/ /sys/bus/pci/drivers/nvidia/
echo "$MARK values"
grep -Hs . /sys/class/net/*/address /sys/class/net/*/mtu /sys/class/net/*/operstate \
  /sys/bus/pci/drivers/nvidia/*/numa_node /sys/class/infiniband/*/device/numa_node \
  /sys/class/infiniband/*/ports/*/state /sys/class/infiniband/*/ports/*/phys_state \
  /sys/class/infiniband/*/ports/*/link_layer /sys/class/infiniband/*/ports/*/rate \
  /sys/class/infiniband/*/ports/*/pkeys/0 /sys/class/infiniband/*/ports/*/gid_attrs/types/* \
  /sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*
grep -Hsvx "$ZERO_GID" /sys/class/infiniband/*/ports/*/gids/*
echo "$MARK imex"
for c in /dev/nvidia-caps-imex-channels/*; do [ -e "$c" ] && echo "channel ${c##*/}"; done
echo "service $(systemctl is-active nvidia-imex 2>/dev/null) $(systemctl is-enabled nvidia-imex 2>/dev/null)"
echo "$MARK imex-nodes"; cat /etc/nvidia-imex/nodes_config.cfg
echo "$MARK modules"; cut -d' ' -f1 /proc/modules | grep -E "^($MODULES)$"
echo "$MARK dev-infiniband"; ls /dev/infiniband
true
