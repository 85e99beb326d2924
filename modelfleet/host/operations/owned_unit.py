"""A systemd unit modelfleet owns whole: its own unit file and nothing else that systemd merges into it.

Drop-ins, a unit file that outranks ours and a mask are drift: removed (and the unit restarted where they
changed what runs), or, where the host keeps its own drop-ins (`unit_dropins: keep`), the host is refused with a
line per file before anything is touched. Every stage that runs a unit goes through here, so drift hides in
none of them."""

from __future__ import annotations

from modelfleet.host.operations.report import fail_host, note_once
from modelfleet.host.operations.service import unit_running, unit_unmasked
from modelfleet.host.units import Merged, merged, what_it_sets


def refused_when_kept(keep: bool, units: dict[str, dict], name: str = "Units: files modelfleet did not write") -> bool:
    """With `keep`, refuse the host (True) when any of `units` (name -> its DeployedState) has a foreign file."""
    foreign = [(u, path) for u, current in units.items() for path in merged(u, current).foreign]
    if not (keep and foreign):
        return False
    fail_host(name=name, reasons=[
        f"{u}: {path} {what_it_sets(u, units[u], path)}; this host keeps its own drop-ins (unit_dropins: keep), so "
        "modelfleet will not run the unit it would not own: move the setting into the inventory or remove the file"
        for u, path in foreign])
    return True


def unmasked(unit: str, current: dict) -> Merged:
    """Before the unit's files are written: a mask lifted (an upload would go through its link into /dev/null)."""
    extra = merged(unit, current)
    if extra.masked:
        unit_unmasked(name=f"Unmask {unit}", unit=unit, masked=True)
    return extra


def owned_running(unit: str, current: dict, extra: Merged, reload: bool, restart: bool) -> bool:
    """Enabled and active on its own unit file only, saying what was removed; True when it (re)starts."""
    restart = restart or extra.restart
    if extra.drift:
        note_once(name=f"Unit {unit}: only what modelfleet wrote", message=f"modelfleet: {unit}: " + "; ".join(
            [f"removing {path}, not written by modelfleet ({what_it_sets(unit, current, path)})"
             for path in extra.foreign] + ["unmasking it"] * extra.masked
            + ["systemd had not loaded its unit file"] * (current.get("NeedDaemonReload") == "yes")
            + ["restarting it on its own unit file"] * extra.restart))
    unit_running(name=f"Run {unit}", unit=unit, current=current, reload=reload or extra.reload, restart=restart,
                 remove=extra.foreign)
    return restart or current.get("ActiveState") != "active"
