"""What the fan-out's token and unprivileged server cost, on a lab host, in one run (JSON on stdout):

    python -m lab.bench_fanout_trust [--files 8] [--size-mib 128] [--runs 3] [--baseline-commit 8317439]

lab/fanout_compare.py runs on the lab's first host (systemd as PID 1) with the peer server started as the
stages start it (systemd-run, DynamicUser and the other properties of modelfleet.host.transfer.SERVER_PROPERTIES, the
job with the token on stdin) beside the fetch script of --baseline-commit (its server as root, no token, no
challenge), each with its own curl, interleaved: receiver ÷ curl now, and then."""

import argparse
import json
import subprocess
import sys

import lab
from modelfleet import FILES_DIR, REPO_ROOT
from modelfleet.host.transfer import SERVER_PROPERTIES

WORK = "/srv/fanout-trust"  # not under /tmp: the unit's PrivateTmp hides the host's


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline-commit", default="8317439")
    args = parser.parse_args()
    host = f"{lab.PREFIX}1"
    old = subprocess.run(["git", "show", f"{args.baseline_commit}:modelfleet/files/modelfleet_fetch.py"],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    subprocess.run(["docker", "exec", host, "sh", "-c",
                    f"rm -rf {WORK} && mkdir -p {WORK}/lab {WORK}/modelfleet/files"], check=True)
    for source, dest in ((REPO_ROOT / "lab" / "fanout_compare.py", "lab/fanout_compare.py"),
                         (FILES_DIR / "modelfleet_fetch.py", "modelfleet/files/modelfleet_fetch.py")):
        subprocess.run(["docker", "cp", str(source), f"{host}:{WORK}/{dest}"], check=True)
    subprocess.run(["docker", "exec", "-i", host, "sh", "-c", f"cat > {WORK}/fetch_old.py"], input=old, text=True,
                   check=True)
    run = subprocess.run(["docker", "exec", host, "python3", f"{WORK}/lab/fanout_compare.py", "--work",
                          f"{WORK}/work", "--files", str(args.files), "--size-mib", str(args.size_mib), "--runs",
                          str(args.runs), "--unprivileged", "--baseline", f"{WORK}/fetch_old.py",
                          *(f"--server-property={p}" for p in SERVER_PROPERTIES)], capture_output=True, text=True)
    subprocess.run(["docker", "exec", host, "rm", "-rf", WORK])
    if run.returncode:
        sys.exit(run.stdout[-3000:] + run.stderr[-3000:])
    figures = json.loads(run.stdout)
    rates = figures["median_mb_s"]
    figures["summary"] = {
        "receiver_over_curl_token_unprivileged": figures["over_curl"].get("fetch"),
        "receiver_over_curl_baseline": figures["baseline_over_curl_baseline"],
        "curl_token_unprivileged_over_curl_baseline": round(rates["curl"] / rates["curl-baseline"], 3),
        "receiver_over_receiver_baseline": round(rates["fetch"] / rates["fetch-baseline"], 3),
        "baseline_commit": args.baseline_commit}
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
