"""NVLink error counters (`nvidia-smi nvlink -e`) read per GPU and link, and judged by the thresholds in
modelfleet/plan/catalog/nvlink_errors.yaml (NVIDIA DCGM's health watch, with its source): a replay or recovery error
since the driver loaded refuses the GPU, naming GPU, link and counter; CRC counts are kept and shown (DCGM
judges them by a rate one reading cannot give). A counter the catalog does not name is kept, not judged."""

from __future__ import annotations

import re
from functools import lru_cache

import yaml

from modelfleet.plan.catalog import CATALOG_DIR

GPU_LINE = re.compile(r"^GPU (\d+): ")
COUNTER_LINE = re.compile(r"^\s+Link (\d+): ([A-Za-z][A-Za-z ]*?): (\d+)\s*$")


@lru_cache(maxsize=1)
def catalog() -> dict:
    """{'source': ..., 'counters': {name: {'refuse_at': int | None, 'why': str}}}"""
    return yaml.safe_load((CATALOG_DIR / "nvlink_errors.yaml").read_text())


def gpu_lines(lines: list[str], pattern: re.Pattern):
    """(GPU index, match) for each line matching `pattern` under a `GPU n: ...` head, as every `nvidia-smi nvlink`
    listing prints its links (-s, -e)."""
    gpu = None
    for line in lines:
        head = GPU_LINE.match(line)
        if head:
            gpu = int(head.group(1))
        elif gpu is not None and (match := pattern.match(line)):
            yield gpu, match


def parse(lines: list[str]) -> dict[int, dict[int, dict[str, int]]]:
    """{gpu index: {link: {counter name: value}}}; a GPU without NVLink prints no link lines (then absent), a line
    that is not a counter (blank, `[...]`, an error) is skipped."""
    out: dict[int, dict[int, dict[str, int]]] = {}
    for gpu, counter in gpu_lines(lines, COUNTER_LINE):
        out.setdefault(gpu, {}).setdefault(int(counter.group(1)), {})[counter.group(2)] = int(counter.group(3))
    return out


def nonzero(counters: dict[int, dict[int, dict[str, int]]]) -> list[dict]:
    """Every counter above 0, as the host record shows them: [{gpu, link, counter, value}]."""
    return [{"gpu": gpu, "link": link, "counter": name, "value": value}
            for gpu, links in sorted(counters.items()) for link, named in sorted(links.items())
            for name, value in sorted(named.items()) if value > 0]


def checks(gpu: int, links: dict[int, dict[str, int]]) -> list[dict]:
    """One check per judged counter kind on this GPU: the worst link's value against the catalog's threshold;
    a failure names each link at or over it."""
    out = []
    for name, rule in catalog()["counters"].items():
        limit = rule["refuse_at"]
        seen = {link: named[name] for link, named in links.items() if name in named}
        if limit is None or not seen:
            continue
        over = {link: value for link, value in sorted(seen.items()) if value >= limit}
        reason = "; ".join(f"GPU {gpu} NVLink link {link}: {value} {name} since the driver loaded"
                           for link, value in over.items())
        out.append({"check": "nvlink_errors", "gpu": gpu, "counter": name, "value": max(seen.values()),
                    "threshold": limit, "ok": not over,
                    "reason": f"{reason} (refused at {limit}: {rule['why']})" if over else ""})
    return out
