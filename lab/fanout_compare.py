"""The checkpoint fan-out's receiver beside native clients, on one host, in one run (stdlib only, so it runs on
a lab host or a GPU host as it is):

    python3 lab/fanout_compare.py --work DIR [--files 8] [--size-mib 1024] [--runs 3] [--workers 8]

A source directory of --files files of --size-mib MiB each (distinct bytes) is served by the fetch script's own
peer server (`modelfleet_fetch.py serve`, sendfile, its job with the run's token on stdin; with --unprivileged
through `systemd-run` and each --server-property, as the stages start it) on loopback, then copied to a fresh
directory on the same disk by, in turn, each run:
  fetch        modelfleet_fetch.py JOB peer URL: the challenge, then streams with the token, sha256 while the
               bytes arrive, verifies, writes its manifest
  curl         one `curl -s -o` per file with the token's header, --workers at a time (the same number of
               streams), no check
  curl+sha256  the same, then `sha256sum` of every file, --workers at a time (the same trust as fetch)
  aria2c       `aria2c -x1 -s1 -j --workers` with each file's sha-256 from an input file, when aria2c is installed
               (one stream per file: the peer server answers no range requests)
  cp           `cp` of every file, --workers at a time (no network, no check)
  *-baseline   with --baseline OLD: fetch and curl again against OLD's own server and OLD's receiver. An OLD
               that reads its server's job on stdin gets the same token (its own challenge, without the
               proof keys): what a change of the fetch script costs; an older one (`OLD serve DIR ADDR PORT`,
               root, no token): what the token and the unprivileged server cost
Each method's time ends after `sync` of the destination's filesystem, so bytes still in the page cache are not
counted as written. The source is read once first, so every method reads it from the page cache.
Prints one JSON document: every run's seconds and MB/s, each client's CPU seconds per GB, the medians, each
method's median rate over curl's, and what one core hashes (sha256 of bytes in memory): the receiver's ceiling
where cores are few.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FETCH = Path(__file__).resolve().parent.parent / "modelfleet" / "files" / "modelfleet_fetch.py"
BLOCK = 16 << 20


def make_source(src: Path, files: int, size: int) -> dict:
    """Distinct bytes per file (a random block, each copy stamped with its file and offset); {rel: meta}."""
    src.mkdir(parents=True, exist_ok=True)
    block = os.urandom(BLOCK)

    def one(i: int):
        rel = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        digest = hashlib.sha256()
        with (src / rel).open("wb") as f:
            for offset in range(0, size, BLOCK):
                chunk = f"{i}:{offset}".encode().ljust(64, b"\0") + block[64:min(BLOCK, size - offset)]
                f.write(chunk)
                digest.update(chunk)
        return rel, {"size": size, "sha256": digest.hexdigest(), "blob_id": None}

    with ThreadPoolExecutor(min(files, os.cpu_count() or 1)) as pool:
        return dict(pool.map(one, range(files)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(command: list[str] | str, dest: Path, **kw) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds until the bytes are on disk, and the client's CPU seconds (user + system, its children's
    included; the server's are not: it is still running)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["sync", "-f", str(dest)], check=True)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return time.perf_counter() - start, cpu, done


def fresh(path: Path, text: str) -> Path:
    """`path` written anew: the receiver removes a job holding a token once it has read it."""
    path.write_text(text)
    return path


def parallel(template: str, items: list[str], workers: int) -> str:
    """A shell line running `template` (with {} for the item) over items, `workers` at a time."""
    quoted = " ".join(f"'{i}'" for i in items)
    return f"printf '%s\\n' {quoted} | xargs -P {workers} -I{{}} {template}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--baseline", type=Path, help="an earlier fetch script (server and receiver), run beside "
                        "this one as fetch-baseline and curl-baseline")
    parser.add_argument("--unprivileged", action="store_true", help="start the server with systemd-run")
    parser.add_argument("--server-property", action="append", default=[], help="a unit property for it")
    args = parser.parse_args()
    work: Path = args.work
    shutil.rmtree(work, ignore_errors=True)
    src, dest = work / "src", work / "dest"
    t0 = time.perf_counter()
    files = make_source(src, args.files, args.size_mib << 20)
    made_s = time.perf_counter() - t0
    total = sum(m["size"] for m in files.values())
    rels = sorted(files)
    subprocess.run(f"cat {src}/* > /dev/null", shell=True, check=True)  # the source in the page cache
    token, key, source_name = os.urandom(32).hex(), os.urandom(32).hex(), "bench-source"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve_job = work / "serve.json"
    serve_job.write_text(json.dumps({"dir": str(src), "address": "127.0.0.1", "port": port, "token": token,
                                     "files": rels, "rate_mb_s": None, "name": source_name, "proof_key": key}))
    serve_job.chmod(0o600)
    unit = f"modelfleet-fanout-compare-{port}"
    if args.unprivileged:  # as the stages start it: systemd opens the job, the server runs as a dynamic user
        subprocess.run(["systemd-run", f"--unit={unit}", "--collect",
                        *(f"--property={p}" for p in args.server_property),
                        f"--property=StandardInput=file:{serve_job}", "python3", str(FETCH), "serve"],
                       check=True, capture_output=True)
        servers = []
    else:
        servers = [subprocess.Popen([sys.executable, str(FETCH), "serve"], stdin=serve_job.open("rb"),
                                    stderr=subprocess.DEVNULL)]
    old_url, tokened = None, False
    if args.baseline:
        old_port = free_port()
        old_url = f"http://127.0.0.1:{old_port}"
        tokened = "json.load(sys.stdin)" in args.baseline.read_text()
        if tokened:  # its job on stdin, the same token
            old_serve = work / "serve-baseline.json"
            old_serve.write_text(json.dumps({"dir": str(src), "address": "127.0.0.1", "port": old_port,
                                             "token": token, "files": rels, "rate_mb_s": None}))
            servers.append(subprocess.Popen([sys.executable, str(args.baseline), "serve"],
                                            stdin=old_serve.open("rb"), stderr=subprocess.DEVNULL))
        else:
            servers.append(subprocess.Popen([sys.executable, str(args.baseline), "serve", str(src), "127.0.0.1",
                                             str(old_port)], stderr=subprocess.DEVNULL))
    for address in [port] + ([old_port] if args.baseline else []):
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", address), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
    job = work / "job.json"
    job_text = json.dumps({"repo": "bench/fanout", "commit": "0" * 40, "endpoint": url, "dest": str(dest),
                           "token_file": None, "files": files, "token": token, "proofs": {source_name: key}})
    old_job = work / "job-baseline.json"
    old_job_text = json.dumps({"repo": "bench/fanout", "commit": "0" * 40, "endpoint": url, "dest": str(dest),
                               "token_file": None, "files": files, **({"token": token} if tokened else {})})
    header = work / "curl-header"
    header.write_text(f"Authorization: Bearer {token}\n")  # curl reads it from a file: never in argv
    header.chmod(0o600)
    sums = work / "SHA256SUMS"
    sums.write_text("".join(f"{m['sha256']}  {rel}\n" for rel, m in sorted(files.items())))
    aria_input = work / "aria2.txt"
    aria_input.write_text("".join(f"{url}/{rel}\n  out={rel}\n  checksum=sha-256={m['sha256']}\n"
                                  for rel, m in sorted(files.items())))
    w = args.workers
    curl = f"curl -sSf -H @{header}"
    methods = {
        "fetch": lambda: [sys.executable, str(FETCH), str(fresh(job, job_text)), "peer", url,
                          f"--source-name={source_name}"],
        "curl": lambda: parallel(f"{curl} -o {dest}/{{}} {url}/{{}}", rels, w),
        "curl+sha256": lambda: (parallel(f"{curl} -o {dest}/{{}} {url}/{{}}", rels, w) + f" && cd {dest} && "
                                + parallel("sha256sum {}", rels, w) + f" | sort -k2 | diff - {sums}"),
        **({"fetch-baseline": lambda: [sys.executable, str(args.baseline), str(fresh(old_job, old_job_text)), "peer",
                                       old_url],
            "curl-baseline": lambda: parallel(f"{curl if tokened else 'curl -sSf'} -o {dest}/{{}} {old_url}/{{}}",
                                              rels, w)}
           if args.baseline else {}),
        "cp": lambda: parallel(f"cp {src}/{{}} {dest}/{{}}", rels, w),
    }
    if shutil.which("aria2c"):
        methods["aria2c"] = lambda: ["aria2c", "-q", "-x1", "-s1", "-j", str(w), "--file-allocation=none",
                                     "-d", str(dest), "-i", str(aria_input)]
    runs: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, list[float]] = {name: [] for name in methods}
    errors = {}
    try:
        for _ in range(args.runs):
            for name, command in methods.items():  # interleaved, so drift hits every method alike
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir(parents=True)
                (work / "job.json.log").unlink(missing_ok=True)
                cmd = command()
                seconds, used, done = timed(cmd, dest, shell=isinstance(cmd, str))
                got = sum(p.stat().st_size for p in dest.iterdir() if p.name in files)
                if done.returncode or got != total:
                    errors[name] = f"rc={done.returncode} bytes={got}/{total} {done.stderr[-400:]}"
                    continue
                runs[name].append(seconds)
                cpu[name].append(used)
    finally:
        for server in servers:
            server.terminate()
        if args.unprivileged:
            subprocess.run(["systemctl", "stop", unit], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    block = os.urandom(BLOCK)
    start = time.perf_counter()
    for _ in range(32):
        hashlib.sha256(block)
    sha_rate = 32 * BLOCK / (time.perf_counter() - start) / 1e6
    medians = {n: statistics.median(s) for n, s in runs.items() if s}
    rate = {n: total / s / 1e6 for n, s in medians.items()}
    print(json.dumps({
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
        "cpus": os.cpu_count(), "files": args.files, "file_mib": args.size_mib, "bytes": total, "workers": w,
        "source_made_s": round(made_s, 2), "sha256_one_core_mb_s": round(sha_rate, 1),
        "runs_s": {n: [round(s, 3) for s in v] for n, v in runs.items()},
        "median_mb_s": {n: round(r, 1) for n, r in rate.items()},
        "client_cpu_s_per_gb": {n: round(statistics.median(v) / (total / 1e9), 2) for n, v in cpu.items() if v},
        "over_curl": {n: round(r / rate["curl"], 3) for n, r in rate.items()} if "curl" in rate else {},
        "baseline_over_curl_baseline": round(rate["fetch-baseline"] / rate["curl-baseline"], 3)
        if {"fetch-baseline", "curl-baseline"} <= set(rate) else None,
        "unprivileged": args.unprivileged,
        "errors": errors}, indent=1))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
