"""The fabric fact and the netcheck gate on a real GPU host, driven by modelfleet's own code:

1. the preflight probe with its fabric part (HostProbe().command(fabric=True), run by `sh -c` as pyinfra runs it),
   read by HostProbe().process; the fabric part's raw output is kept as fabric-probe.txt;
2. the host as a one-host pool (`@local`, h200, its fabric_address the address of the interface that carries its
   default route) and modelfleet.host.fabric.derive over that pool: interface, host IP variables, HCAs, devices;
3. the gate's script (files/nccl_check.py) with the arguments netcheck.check_command renders for the member with
   that fabric (outside docker: the host has none, and nothing can reach a registry to pin the image's
   digest), NCCL's INFO log on as the gate sets it for pools across hosts, and the collectives a pool of
   several GPUs gets (all_reduce, all_gather; 1M..16G); the output read by netcheck.host_report and judged by
   netcheck.judge with the member's fabric;
4. the gate's reachability check with two node ranks on this host (Gloo, its sweep to 64M) over the derived
   interface, then with the worker bound to an interface that is down: it must fail within the reach timeout,
   naming the pair.

Run on the GPU host:  python3 lab/h200/fabric_gate.py --out OUT   (everything goes to OUT/results.json)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from modelfleet import FILES_DIR  # noqa: E402
from modelfleet.host import fabric as fab  # noqa: E402
from modelfleet.host.facts.probe import MARK, HostProbe  # noqa: E402
from modelfleet.plan.inventory import resolve  # noqa: E402
from modelfleet.run.stages import netcheck  # noqa: E402

SCRIPT = FILES_DIR / "nccl_check.py"
POOL_OPS = "all_reduce,all_gather"  # what check_command gives a pool of several GPUs (no expert parallelism)


def run_probe() -> tuple[list[str], float, list[str]]:
    """The whole preflight probe with its fabric part; its lines, seconds, and the fabric part's own lines."""
    command = HostProbe().command(fabric=True)
    start = time.perf_counter()
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - start
    lines = done.stdout.splitlines()
    part, inside = [], False
    for line in lines:
        if line == f"{MARK} fabric":
            inside = True
        elif inside and line.startswith(f"{MARK} rc="):
            break
        elif inside:
            part.append(line)
    return lines, seconds, part


def own_address(fact: dict) -> str:
    """The IPv4 address of the interface that carries the default route (the address peers would use)."""
    dev = next(r["dev"] for r in fact["routes"] if r["dst"] == "0.0.0.0/0")
    return next(a["address"] for a in fact["interfaces"][dev]["addresses"] if a["family"] == "inet")


def gate_argv(svc, fabric: fab.HostFabric) -> tuple[list[str], dict[str, str], str]:
    """The script's arguments and environment from the docker command check_command renders for this member."""
    command = netcheck.check_command(replace(svc, fabric=fabric), svc.image)
    argv = shlex.split(command.rsplit(" < ", 1)[0])
    env = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-e")
    return argv[argv.index("nccl_check") + 1:], env, command


def with_arg(args: list[str], name: str, value: str | None) -> list[str]:
    out = list(args)
    if name in out:
        at = out.index(name)
        del out[at:at + 2]
    return out + ([name, value] if value is not None else [])


def run_script(args: list[str], env: dict[str, str], timeout: int = 600) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=timeout)
    return {"argv": ["python3", "nccl_check.py", *args], "env": env, "rc": done.returncode,
            "seconds": round(time.perf_counter() - start, 2), "stdout": done.stdout.splitlines(),
            "stderr": done.stderr.splitlines()}


def two_ranks(args: list[str], env: dict[str, str], worker_ifname: str | None) -> list[dict]:
    """Node ranks 0 and 1 of a two-member pool on this host, started together; rank 1 bound to `worker_ifname`."""
    procs, start = [], time.perf_counter()
    for rank in (0, 1):
        argv = with_arg(with_arg(args, "--node-rank", str(rank)), "--ifname", worker_ifname if rank else
                        env.get("GLOO_SOCKET_IFNAME"))
        procs.append((argv, subprocess.Popen([sys.executable, str(SCRIPT), *argv], env={**os.environ, **env},
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    out = []
    for argv, proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        out.append({"argv": ["python3", "nccl_check.py", *argv], "rc": proc.returncode,
                    "seconds": round(time.perf_counter() - start, 2), "stdout": stdout.splitlines(),
                    "stderr": stderr.splitlines()})
    return out


def plain(value):
    return sorted(value) if isinstance(value, set) else str(value)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    out = parser.parse_args().out
    result: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for key, cmd in {"gpu": "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader",
                     "kernel": "uname -r", "os": ". /etc/os-release; echo $PRETTY_NAME",
                     "ip_binary": "command -v ip || echo absent"}.items():
        result[key] = subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()

    # 1. The probe, as preflight sends it.
    lines, seconds, part = run_probe()
    (out / "fabric-probe.txt").write_text("\n".join(part) + "\n")
    probe = HostProbe().process(lines)
    fact = probe["fabric"]
    result["probe"] = {"seconds": round(seconds, 3), "lines": len(lines), "fabric_lines": len(part),
                       "parts_read": sorted(k for k, v in probe.items() if v is not None), "fabric": fact}
    print(f"probe: {len(lines)} lines in {seconds:.3f} s; fabric part {len(part)} lines, source {fact['source']}",
          flush=True)

    # 2. The host as a one-host pool, and the fabric derived over it.
    head = own_address(fact)
    inventory = [("@local", {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm",
                             "pool": "qwen3-8b", "fabric_address": head})]
    resolved = resolve(inventory)
    assert not resolved.errors, resolved.error_lines()
    plan = resolved.hosts["@local"]
    svc = plan.services[0]
    pool = fab.derive(svc.pool, [(plan, fact)])
    result["pool"] = {"inventory": inventory[0][1], "collective": netcheck.collective(svc),
                      "check_command_one_gpu": netcheck.check_command(svc, svc.image),
                      "fabric": fab.report(pool)}
    print(json.dumps(result["pool"]["fabric"], indent=1), flush=True)
    fabric = pool.hosts["@local"]

    # 3. The gate's script with the member's fabric, NCCL's INFO log on, the collectives of a pool of GPUs.
    args, env, command = gate_argv(svc, fabric)
    args = with_arg(args, "--ops", POOL_OPS)
    env = {**env, **netcheck.NCCL_LOG_ENV}
    nccl = run_script(args, env)
    report = netcheck.host_report(nccl["rc"] == 0, nccl["stdout"], nccl["stderr"])
    minimum = netcheck.threshold(replace(svc, fabric=fabric, nnodes=2))  # as a member of a pool across hosts
    verdict = netcheck.judge(svc.pool, ["@local"], {"@local": report}, minimum, fabrics={"@local": fabric})
    single = netcheck.judge(svc.pool, ["@local"], {"@local": report}, netcheck.threshold(svc))
    result["nccl"] = {"docker_command": command, "run": nccl,
                      "nccl_info_lines": [line for line in nccl["stdout"] if "NCCL INFO" in line],
                      "report": report, "verdict_as_member": verdict, "verdict_single_node_threshold": single}
    print(f"nccl: rc {nccl['rc']} in {nccl['seconds']} s; transport {json.dumps(report.get('transport'))}", flush=True)
    print(f"verdict as member: ok={verdict['ok']} problems={verdict['problems']}", flush=True)
    print(f"verdict against the single-node threshold {single['threshold_gbps']}: ok={single['ok']} "
          f"problems={single['problems']}", flush=True)

    # 4. Reachability over the derived interface, two node ranks on this host (Gloo), then over an interface down.
    gloo = with_arg(with_arg(with_arg(args, "--backend", "gloo"), "--local-procs", "1"), "--max-bytes",
                    netcheck.MAX_BYTES["gloo"])
    gloo = with_arg(with_arg(with_arg(gloo, "--nnodes", "2"), "--reach-timeout", str(netcheck.REACH_TIMEOUT_S)),
                    "--ifname", fabric.ifname)
    down = sorted(n for n, i in fact["interfaces"].items() if i.get("state") == "down")
    result["reach"] = {}
    for case, ifname, timeout in (("derived", fabric.ifname, netcheck.REACH_TIMEOUT_S),
                                  ("down", down[0] if down else None, 5)):
        if ifname is None:
            result["reach"][case] = {"skipped": "no interface is down on this host"}
            continue
        ranks = two_ranks(with_arg(gloo, "--reach-timeout", str(timeout)), env, ifname)
        reports = {f"rank{i}": netcheck.host_report(r["rc"] == 0, r["stdout"], r["stderr"])
                   for i, r in enumerate(ranks)}
        members = list(reports)
        judged = netcheck.judge(svc.pool, members, reports, None, fabrics={m: fabric for m in members})
        result["reach"][case] = {"worker_ifname": ifname, "ranks": ranks, "reports": reports, "verdict": judged}
        print(f"reach {case} (worker over {ifname}): rc {[r['rc'] for r in ranks]} in "
              f"{[r['seconds'] for r in ranks]} s; ok={judged['ok']} problems={judged['problems']}", flush=True)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=plain) + "\n")
    # The run passes when the member passes, the reachability check over the derived interface passes and the
    # one over a down interface fails (where the host has one).
    reach = result["reach"]
    down = reach["down"].get("verdict")
    return 0 if (verdict["ok"] and reach["derived"]["verdict"]["ok"] and not (down and down["ok"])) else 1


if __name__ == "__main__":
    sys.exit(main())
