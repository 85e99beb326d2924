"""Stage retire: the units modelfleet wrote on the host that its plan no longer names (modelfleet.run.retire) are
stopped, disabled and removed, each named in the output and in reports/retired/<host>.json. It runs after the
router stage, and every host calls its one operation from the same place, so the front doors have taken a
replica the inventory dropped out of their lists before its unit stops."""

from __future__ import annotations

from pyinfra.api import deploy

from modelfleet.host.units import UNIT_DIR
from modelfleet.plan.inventory.plan import HostPlan
from modelfleet.run import retire
from modelfleet.run.context import HostRun

NAME = "retire"
PINS: frozenset[str] = frozenset()


def wants(plan: HostPlan, probe: dict) -> dict:
    return {"owned": [UNIT_DIR]}


@deploy("modelfleet retire")
def run(ctx: HostRun):
    plan = ctx.plan
    owned = ctx.deployed()["owned"].get(UNIT_DIR) or {}
    retired = retire.to_retire(owned, retire.named_units(plan), retire.kept_paths(plan))
    retire.units_retired(name="Retire " + (", ".join(r.unit for r in retired) or "units") + " (not in the inventory)",
                         retired=retired, kept_venvs=frozenset(s.venv.name for s in plan.services if s.venv))
