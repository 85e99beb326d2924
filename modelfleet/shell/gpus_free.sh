#!/bin/sh
# Before an engine unit (re)starts: its old engine stopped, the GPUs it holds must be free (an engine that died
# can leave a process holding GPU memory: vLLM #57650). Stops UNIT when STOP is 1, then asks the driver which
# processes hold memory on the unit's GPUs (nvidia-smi's per-process query) for up to WAIT seconds; any still
# there is named in one line and nothing starts (modelfleet.base.host_commands.gpus_free_script).
# Arguments: UNIT STOP WAIT, then the GPU indices.
unit=$1 stop=$2 wait=$3
shift 3
if [ "$stop" = 1 ] && ! systemctl stop "$unit"; then
  echo "modelfleet: $unit: systemctl stop failed: not starting it again before its GPUs are seen free" >&2
  exit 1
fi
held() {
  uuids=$(nvidia-smi --query-gpu=index,uuid --format=csv,noheader | awk -F', *' -v gpus=" $* " \
    'index(gpus, " " $1 " ") { printf "%s=%s ", $2, $1 }')
  nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv,noheader,nounits |
    awk -F', *' -v uuids=" $uuids" '{ at = index(uuids, " " $3 "="); if (at) {
      rest = substr(uuids, at + length($3) + 2); split(rest, g, " ")
      printf "GPU %s: pid %s (%s) holds %s MiB\n", g[1], $1, $2, $4 } }'
}
for _ in $(seq "$wait"); do
  found=$(held "$@")
  [ -z "$found" ] && { echo "free: GPUs $*"; exit 0; }
  sleep 1
done
echo "modelfleet: $unit stopped but its GPUs are still held: $(echo "$found" | paste -sd';' | sed 's/;/; /g'):" \
  "not starting an engine on top of it (kill the process, or reset the GPU, then re-run)" >&2
exit 1
