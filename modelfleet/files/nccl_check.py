#!/usr/bin/env python3
"""Collective bandwidth check for a serving pool, run inside the pool's serving image on every host at once.

    python3 nccl_check.py --nnodes N --node-rank R --master-addr HEAD --master-port P [--local-procs G]
                          [--backend nccl|gloo] [--ops all_reduce,all_gather,all_to_all]
                          [--min-bytes 1M] [--max-bytes 16G] [--factor 2] [--warmup 5] [--iters 20]
                          [--timeout 120] [--h2d-bytes 1G] [--reach-timeout 30 [--ifname IF]] [--hca-loopback]

One process per local GPU (--local-procs, default: every visible GPU; gloo: 1); global rank =
node_rank * local_procs + local_rank, rendezvous at the first host. For each op and message size: warm-up, then
timed iterations (CUDA events on GPUs, wall clock on CPU), time = the slowest rank's mean, and nccl-tests'
definitions: algbw = bytes / time; busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather and
all_to_all. Results are checked (all_reduce of rank+1 must sum to n(n+1)/2; all_gather must hold every rank's
value). Local rank 0 of each host prints one JSON document; the exit status is 0 only when every check passed.
RCCL is reached through the `nccl` backend name on ROCm builds of PyTorch.

--h2d-bytes (admission_h2d): each local GPU's copy bandwidth from and to pinned host memory, one GPU at a time
as nvbandwidth's host_to_device_memcpy_ce / device_to_host_memcpy_ce measure it (one copy of that many bytes,
after warm-up, timed with CUDA events; the median of --iters), reported per GPU under "h2d". With --ops ""
only this runs (a pool of one GPU has no collective to check).

--reach-timeout (pools across hosts): before anything else, every member connects to the head's rendezvous port
from its interface (--ifname, bound with SO_BINDTODEVICE) and the head waits for all of them, for at most that
many seconds; a pair that cannot talk fails in seconds, named, instead of NCCL's long rendezvous timeout.

--hca-loopback: after the pool's collectives, this host's own all_reduce (largest size) with shared memory, P2P
and NVLS off, so every byte crosses its HCAs (the per-host figure the gate compares with the pool's median),
printed as a second JSON line {"hca_loopback": {...}}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)  # Linux's value where Python does not name it
# NCCL lines kept from the loopback run: the HCAs or interfaces it really went through.
NET_LINES = ("NET/IB", "NET/Socket", "Using network")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "all_to_all": lambda n: (n - 1) / n}


def parse_bytes(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1:] in UNITS else int(text)


def sizes(args) -> list[int]:
    out, size = [], args.min_bytes
    while size <= args.max_bytes:
        out.append(size)
        size = int(size * args.factor)
    return out


def fail(report: dict, message: str, code: int = 1):
    report.update(ok=False, error=message)
    print(json.dumps(report), flush=True)
    sys.exit(code)


def worker(local_rank: int, args) -> None:
    # torch is in the serving image this runs in, not on the host nor the control node that read this file
    import torch
    import torch.distributed as dist

    world = args.nnodes * args.local_procs
    rank = args.node_rank * args.local_procs + local_rank
    gpu = args.backend == "nccl"
    report = {"ok": False, "host": socket.gethostname(), "node_rank": args.node_rank, "rank": rank,
              "world_size": world, "backend": args.backend, "torch": torch.__version__,
              "master": f"{args.master_addr}:{args.master_port}", "reach_s": args.reach_s,
              "interface": {k: os.environ[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA")
                            if k in os.environ}}
    if gpu:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        report["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        report["device"] = torch.cuda.get_device_name(local_rank)
    else:
        device = torch.device("cpu")
    if args.h2d_bytes and not gpu:  # before the rendezvous, which would wait for this rank
        fail(report, "the host-to-device check needs a GPU in the container: none is visible")
    try:
        dist.init_process_group(args.backend, init_method=f"tcp://{args.master_addr}:{args.master_port}",
                                rank=rank, world_size=world, timeout=datetime.timedelta(seconds=args.timeout),
                                **({"device_id": device} if gpu else {}))
    except Exception as error:  # a rank that never joins, or a rendezvous address nobody answers on
        fail(report, f"rank {rank}: rendezvous at {args.master_addr}:{args.master_port} failed within "
                     f"{args.timeout} s ({type(error).__name__}: {str(error).splitlines()[0][:300]}); a rank never "
                     f"joined or the address/interface is wrong")
    copies = copies_in_turn(local_rank, args, torch, dist, device) if args.h2d_bytes else []
    results = []
    try:
        for op in args.ops:
            for nbytes in sizes(args):
                results.append(measure(op, nbytes, world, rank, device, args, torch, dist))
    except Exception as error:
        fail(report, f"rank {rank}: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
    # Every rank's times reach every rank (a plain tensor all_gather: object collectives need numpy, which
    # serving images need not carry); time is the slowest rank's, as the slowest rank gates the collective.
    gathered = []
    if results:
        mine = torch.tensor([[r["time_us"], float(r["correct"])] for r in results], dtype=torch.float64,
                            device=device)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
    bandwidth = torch.tensor(copies or [0.0, 0.0], dtype=torch.float64, device=device)
    every_copy = [torch.empty_like(bandwidth) for _ in range(world)]
    dist.all_gather(every_copy, bandwidth)
    dist.destroy_process_group()
    if local_rank:
        return
    wrong = summarize(report, results, [[(float(x), float(y)) for x, y in g.tolist()] for g in gathered],
                      [tuple(map(float, c.tolist())) for c in every_copy], args, world)
    print(json.dumps(report), flush=True)
    if wrong:
        sys.exit(1)


def copies_in_turn(local_rank: int, args, torch, dist, device) -> list[float]:
    """This rank's host-to-device copy rates, one GPU of the host at a time (they share the host's memory and
    PCIe root); every local rank waits its turn at the barriers."""
    copies = []
    for turn in range(args.local_procs):
        dist.barrier()
        if turn == local_rank:
            copies = copy_bandwidth(torch, device, args.h2d_bytes, args.iters)
    dist.barrier()
    return copies


def summarize(report: dict, results: list[dict], gathered: list[list[tuple[float, float]]],
              copies: list[tuple[float, float]], args, world: int) -> list[str]:
    """The node's report from every rank's (time, correct) per result and (h2d, d2h) copy rates: each result at
    the slowest rank's time with its bandwidths, this host's GPUs' copy rates. Returns the wrong results."""
    if args.h2d_bytes:  # this host's GPUs
        first = args.node_rank * args.local_procs
        report["h2d"] = [{"gpu": i, "bytes": args.h2d_bytes, "h2d_gbs": round(copies[first + i][0], 2),
                          "d2h_gbs": round(copies[first + i][1], 2)} for i in range(args.local_procs)]
    for i, r in enumerate(results):
        r["time_us"] = round(max(g[i][0] for g in gathered), 2)
        r["correct"] = all(g[i][1] == 1.0 for g in gathered)
        r["algbw_gbs"] = round(r["bytes"] / (r["time_us"] / 1e6) / 1e9, 3)
        r["busbw_gbs"] = round(r["algbw_gbs"] * BUS_FACTOR[r["op"]](world), 3)
    wrong = [f"{r['op']} {r['bytes']} B" for r in results if not r["correct"]]
    report.update(ok=not wrong, results=results,
                  error=f"wrong results: {', '.join(wrong)}" if wrong else None)
    return wrong


def copy_bandwidth(torch, device, nbytes: int, iters: int) -> list[float]:
    """[host-to-device, device-to-host] GB/s between pinned host memory and this GPU (median of `iters`)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    on_gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = []
    for target, source in ((on_gpu, host), (host, on_gpu)):
        for _ in range(2):
            target.copy_(source, non_blocking=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        out.append(nbytes / sorted(times)[len(times) // 2] / 1e9)
    return out


def measure(op: str, nbytes: int, world: int, rank: int, device, args, torch, dist) -> dict:
    """
    One op at one message size, as nccl-tests counts `size`: the all_reduce / all_to_all buffer, and the
    gathered (output) buffer of all_gather, each rank sending size / n of it.
    """
    count = max(world, nbytes // 4 // world * world)  # float32, divisible by the world size
    send = count // world if op == "all_gather" else count
    data = torch.full((send,), float(rank + 1), dtype=torch.float32, device=device)
    if op == "all_reduce":
        def run():
            buf = data.clone() if check else data
            dist.all_reduce(buf)
            return buf
    elif op == "all_gather":
        out = torch.empty(count, dtype=torch.float32, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13

        def run():
            gather(out, data)
            return out
    else:
        out = torch.empty_like(data)

        def run():
            dist.all_to_all_single(out, data)
            return out
    check = True
    result = run()
    if op == "all_reduce":
        correct = bool(torch.all(result == world * (world + 1) / 2))
    elif op == "all_gather":
        expected = torch.arange(1, world + 1, device=device, dtype=torch.float32).repeat_interleave(send)
        correct = bool(torch.equal(result, expected))
    else:
        expected = torch.arange(1, world + 1, device=device, dtype=torch.float32).repeat_interleave(count // world)
        correct = bool(torch.equal(result, expected))
    check = False
    for _ in range(args.warmup):
        run()
    gpu = device.type == "cuda"
    if gpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(args.iters):
            run()
        end.record()
        torch.cuda.synchronize()
        elapsed_us = start.elapsed_time(end) * 1000 / args.iters
    else:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            run()
        elapsed_us = (time.perf_counter() - t0) * 1e6 / args.iters
    return {"op": op, "bytes": count * 4, "count": count, "time_us": round(elapsed_us, 2), "correct": correct}


def reach(args) -> float:
    """Every member reaches the head's rendezvous port over its interface within --reach-timeout seconds (the
    head listens, each member says hello from its interface), or this host's report names the pair."""
    report = {"host": socket.gethostname(), "node_rank": args.node_rank, "backend": args.backend, "stage": "reach",
              "master": f"{args.master_addr}:{args.master_port}", "ifname": args.ifname}
    start = time.monotonic()
    deadline, where = start + args.reach_timeout, f"{args.master_addr}:{args.master_port}"
    family = socket.AF_INET6 if ":" in args.master_addr else socket.AF_INET
    if args.node_rank == 0:
        try:
            server = socket.create_server((args.master_addr, args.master_port), family=family)
        except OSError as error:
            fail(report, f"the head cannot listen on {where} ({error.strerror or error}): the address is not on "
                         "this host, or the port is taken")
        waiting = set(range(1, args.nnodes))
        while waiting and time.monotonic() < deadline:
            server.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                conn, _ = server.accept()
            except OSError:
                break
            with conn:
                try:
                    conn.settimeout(5)
                    rank = int(conn.recv(256).split()[0])
                    conn.sendall(b"ok\n")
                    conn.recv(1)  # the member closes first: the port the rendezvous binds next keeps no TIME_WAIT
                except (OSError, ValueError, IndexError):
                    continue
            waiting.discard(rank)
        server.close()
        if waiting:
            fail(report, f"node rank(s) {', '.join(map(str, sorted(waiting)))} did not reach the head at {where} "
                         f"within {args.reach_timeout} s")
        return round(time.monotonic() - start, 2)
    over, last = f" over {args.ifname}" if args.ifname else "", "no answer"
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if args.ifname:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, args.ifname.encode())
                except OSError as error:
                    fail(report, f"interface {args.ifname}: {error.strerror or error} (not on this host, or it "
                                 "cannot be bound)")
            sock.settimeout(max(0.1, min(2.0, deadline - time.monotonic())))
            sock.connect((args.master_addr, args.master_port))
            sock.sendall(f"{args.node_rank} {socket.gethostname()}\n".encode())
            if sock.recv(3).startswith(b"ok"):
                return round(time.monotonic() - start, 2)
            last = "the head answered something else"
        except OSError as error:
            last = f"{type(error).__name__}: {error.strerror or error}"
        finally:
            sock.close()
        if time.monotonic() >= deadline:
            fail(report, f"node rank {args.node_rank} cannot reach the head at {where}{over} within "
                         f"{args.reach_timeout} s ({last})")
        time.sleep(0.5)


def hca_loopback(args) -> dict:
    """This host alone, all_reduce at the largest size with shared memory, P2P and NVLS off (NCCL then sends
    every byte out through the HCAs and back), in a child process: NCCL reads these settings once."""
    env = {**os.environ, "NCCL_SHM_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0",
           "NCCL_MNNVL_ENABLE": "0"}
    argv = [sys.executable, os.path.abspath(sys.argv[0]), "--nnodes", "1", "--node-rank", "0", "--master-addr",
            "127.0.0.1", "--master-port", str(args.master_port + 1), "--backend", "nccl", "--local-procs",
            str(args.local_procs), "--ops", "all_reduce", "--min-bytes", str(args.max_bytes), "--max-bytes",
            str(args.max_bytes), "--warmup", str(args.warmup), "--iters", str(args.iters), "--timeout",
            str(args.timeout)]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout * 5)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"the HCA loopback did not finish within {args.timeout * 5} s"}
    lines = done.stdout.splitlines()
    found = [json.loads(line) for line in lines if line.startswith("{")]
    net = [line for line in lines if any(word in line for word in NET_LINES)][:40]
    if not found or not found[-1].get("ok"):
        error = found[-1].get("error") if found else " | ".join(done.stderr.splitlines()[-3:])[:400]
        return {"ok": False, "error": f"HCA loopback: {error}", "net_lines": net}
    largest = max(found[-1]["results"], key=lambda r: r["bytes"])
    return {"ok": True, "bytes": largest["bytes"], "busbw_gbs": largest["busbw_gbs"], "net_lines": net}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, default=29511)
    parser.add_argument("--local-procs", type=int, default=0)
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--ops", default="all_reduce,all_gather", type=lambda s: [op for op in s.split(",") if op])
    parser.add_argument("--min-bytes", type=parse_bytes, default=parse_bytes("1M"))
    parser.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("1G"))
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=int, default=120)
    parser.add_argument("--h2d-bytes", type=parse_bytes, default=0)
    parser.add_argument("--reach-timeout", type=int, default=0)
    parser.add_argument("--ifname", default=None)
    parser.add_argument("--hca-loopback", action="store_true")
    args = parser.parse_args()
    unknown = sorted(set(args.ops) - set(BUS_FACTOR))
    if unknown:
        parser.error(f"unknown op(s) {unknown}; known: {sorted(BUS_FACTOR)}")
    # Before torch is even imported: a member that cannot reach the head fails in seconds.
    args.reach_s = reach(args) if args.nnodes > 1 and args.reach_timeout else None
    # torch is in the serving image this runs in, not on the host nor the control node that read this file
    import torch

    if args.backend == "nccl" and not torch.cuda.is_available():
        fail({"host": socket.gethostname(), "backend": "nccl"}, "backend nccl needs GPUs: none is visible")
    if not args.local_procs:
        args.local_procs = torch.cuda.device_count() if args.backend == "nccl" else 1
    if args.local_procs == 1:
        worker(0, args)
    else:
        # torch is in the serving image this runs in, not on the host nor the control node that read this file
        import torch.multiprocessing as mp

        context = mp.start_processes(worker, args=(args,), nprocs=args.local_procs, join=False,
                                     start_method="spawn")
        try:
            while not context.join():
                pass
        except mp.ProcessExitedException as error:
            sys.exit(error.exit_code or 1)
    if args.hca_loopback:
        print(json.dumps({"hca_loopback": hca_loopback(args)}), flush=True)


if __name__ == "__main__":
    main()
