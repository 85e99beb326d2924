"""Cost per successful task, the guides' formula, from one bench result and a small YAML of prices:

    (GPU compute or API charges + storage and network + operations + human correction)
        / successfully completed tasks

over the same measurement period (the bench's levels, back to back). Failed attempts and retries stay in the
compute or API total once, as they happened; the divisor counts unique completed tasks, not requests.

Prices YAML, self-hosted:   compute: {gpu_hour_usd: 6.5, gpus: 8}
            or hosted API:  api: {input_per_mtok_usd: 0.6, output_per_mtok_usd: 2.5}
and for the period:         storage_network_usd, operations_usd, human_correction_usd (default 0)
"""

from __future__ import annotations

from pathlib import Path

import yaml

from modelfleet.base.errors import ModelfleetError

PERIOD_COSTS = ("storage_network_usd", "operations_usd", "human_correction_usd")


class PriceError(ModelfleetError, ValueError):
    pass


def load_prices(path: Path) -> dict:
    prices = yaml.safe_load(path.read_text()) or {}
    if ("compute" in prices) == ("api" in prices):
        raise PriceError(f"{path}: give exactly one of `compute` (gpu_hour_usd, gpus) or `api` "
                         "(input_per_mtok_usd, output_per_mtok_usd)")
    wanted = {"compute": ("gpu_hour_usd", "gpus"), "api": ("input_per_mtok_usd", "output_per_mtok_usd")}
    for kind, fields in wanted.items():
        for name in fields if kind in prices else ():
            if not isinstance((prices[kind] or {}).get(name), (int, float)) or prices[kind][name] < 0:
                raise PriceError(f"{path}: {kind}.{name} must be a number >= 0")
    for name in PERIOD_COSTS:
        if not isinstance(prices.get(name, 0), (int, float)) or prices.get(name, 0) < 0:
            raise PriceError(f"{path}: {name} must be a number >= 0")
    return prices


def cost_per_task(bench: dict, prices: dict) -> dict:
    levels = bench["levels"]
    period_s = sum(level["duration_s"] for level in levels)
    input_tokens = sum(level["total_input_tokens"] for level in levels)
    output_tokens = sum(level["total_output_tokens"] for level in levels)
    tasks = sum(level["successful_tasks"] for level in levels)
    if "compute" in prices:
        c = prices["compute"]
        charges = c["gpu_hour_usd"] * c["gpus"] * period_s / 3600
        basis = f"{c['gpus']} GPU x {period_s / 3600:.4f} h x ${c['gpu_hour_usd']}/GPU-h"
    else:
        a = prices["api"]
        charges = input_tokens / 1e6 * a["input_per_mtok_usd"] + output_tokens / 1e6 * a["output_per_mtok_usd"]
        basis = (f"{input_tokens} in + {output_tokens} out tokens at "
                 f"${a['input_per_mtok_usd']}/${a['output_per_mtok_usd']} per Mtok")
    period_costs = {name: float(prices.get(name, 0)) for name in PERIOD_COSTS}
    total = charges + sum(period_costs.values())
    return {
        "endpoint": bench["endpoint"], "model": bench["model"], "period_s": round(period_s, 3),
        "compute_or_api_usd": round(charges, 6), "basis": basis, **period_costs, "total_usd": round(total, 6),
        "attempts": sum(level["attempts"] for level in levels),
        "failed_attempts": sum(level["failed_attempts"] for level in levels),
        "successful_tasks": tasks,
        "cost_per_successful_task_usd": round(total / tasks, 6) if tasks else None,
    }
