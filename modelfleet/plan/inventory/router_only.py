"""A host that runs only front doors (`router_only = True`): no engine, so no `services` nor `model`, the
catalog's `cpu` board (no GPUs: the GPU stack, admission, checkpoint, engine image and engine unit stages have
nothing to do there), and at least one service elsewhere naming it in `router`. The resolver asks these."""

from __future__ import annotations

from typing import Any

BOARD = "cpu"  # catalog/hardware/cpu.yaml: the default board of a router-only host


def board(router_only: bool, hardware: str | None) -> str | None:
    """The board a host is resolved with: its own `hardware`, else `cpu` for a router-only host."""
    return hardware or (BOARD if router_only else None)


def problems(where: str, data: dict[str, Any], hardware) -> list[tuple[str, str, str]]:
    """What a router-only host may not have: an engine to serve (`services`, `model`) or a board with GPUs
    (its GPU stack would be installed for nothing)."""
    out = []
    for fld in ("services", "model"):
        if data.get(fld) is not None:
            out.append((where, fld, f"set, but router_only is True: the host runs only front doors and serves no "
                                    f"model; set {fld} on the hosts that serve it (a group's value reaches every "
                                    "host of the group: move this host out of it)"))
    if hardware is not None and hardware.gpus_per_node:
        out.append((where, "hardware", f"{hardware.id} has GPUs, but router_only is True: a front door needs "
                                       f"none; leave hardware unset (the {BOARD} board) or serve a model here"))
    return out


def idle(router_only_hosts: list[str], named: set[str]) -> list[tuple[str, str, str]]:
    """A router-only host that no service names in `router` would run nothing."""
    return [(f"host {name}", "router_only", f"True, but no service names {name} in `router`: it would run "
                                           "nothing (set `router` on the services it fronts)")
            for name in router_only_hosts if name not in named]


def named(entries: list[tuple[str, Any]]) -> set[str]:
    """The hosts the inventory's services name in `router` (read from the data as given, so a service that does
    not resolve for another reason still counts)."""
    out: set[str] = set()
    for _, data in entries:
        if not isinstance(data, dict):
            continue
        services = data.get("services") if isinstance(data.get("services"), list) else []
        for entry in [data, *services]:
            if isinstance(entry, dict) and isinstance(entry.get("router"), str):
                out.add(entry["router"])
    return out
