"""`modelfleet lab`: the local rehearsal fleet, from a checkout only."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import click

from modelfleet.cli.common import (
    main,
)


@main.group()
def lab() -> None:
    """The local rehearsal fleet (systemd + sshd containers on 127.0.1.N, a registry, engine doubles); from a
    checkout of modelfleet only (the lab/ folder is not part of the installed package)."""


def _lab_module():
    """The checkout's lab/ package: found from the working directory (the repository root)."""
    if not (Path.cwd() / "lab" / "__init__.py").exists():
        raise click.ClickException("`modelfleet lab` runs from the root of a modelfleet checkout (its lab/ folder "
                                   "is not part of the installed package)")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module("lab")


@lab.command("up")
@click.option("--hosts", type=click.IntRange(min=1, max=64), default=3, show_default=True, help="How many lab hosts.")
@click.option("--persona", "personas", multiple=True,
              help="GPU persona per host, repeated round-robin (default h200x1; `modelfleet lab personas` lists "
                   "them); *-bare hosts have no driver, Docker or toolkit yet (deploys/gpu_stack.py installs them).")
@click.option("--disks", type=click.IntRange(min=0, max=16), default=0, show_default=True,
              help="Loop devices per new host, standing in for NVMe drives (512 MiB sparse images).")
def lab_up(hosts: int, personas: tuple[str, ...], disks: int) -> None:
    """Start HOSTS lab hosts (idempotent: running ones are kept)."""
    labmod = _lab_module()
    unknown = sorted(set(personas) - set(labmod.personas()))
    if unknown:
        raise click.UsageError(f"unknown persona {', '.join(unknown)} (personas: {', '.join(labmod.personas())})")
    specs = labmod.up(hosts, list(personas) or None, disks)
    click.echo(json.dumps([{k: s[k] for k in ("name", "address", "persona", "engine", "disks")} for s in specs],
                          indent=2))


@lab.command("personas")
def lab_personas() -> None:
    """Every persona a lab host can take (hardware, GPUs, bare or pre-built, the fault it carries), as JSON."""
    labmod = _lab_module()
    click.echo(json.dumps({name: {"hardware": hw, "gpus": gpus, "bare": bare,
                                  "fault_of": labmod.faults().get(name, {}).get("base")}
                           for name, (hw, gpus, _, bare) in labmod.personas().items()}, indent=2))


@lab.command("down")
def lab_down() -> None:
    """Remove every lab host, its engine containers and the registry process."""
    labmod = _lab_module()
    click.echo(json.dumps(labmod.down()))


@lab.command("status")
def lab_status() -> None:
    """Lab hosts, their containers and SSH reachability, as JSON."""
    labmod = _lab_module()
    click.echo(json.dumps(labmod.status(), indent=2))
