"""One record of what a host is, for `status --json` (and anyone who reads it: an operator, `upgrade`): OS,
kernel and flavour, Secure Boot, driver branch and version, the module's signer, Fabric Manager, IMEX, VBIOS,
each pool's engine image and checkpoint revision, and the admission verdict with its time and expiry. Read in
status's one round trip: `script()` adds two sections, `record()` assembles them with status's own rows."""

from __future__ import annotations

import json
import time

from modelfleet.base.host_commands import MODULE_SIGNER, fabric_manager_version_sh
from modelfleet.host import os as osfam
from modelfleet.host import secure_boot
from modelfleet.host.facts.host import OsRelease
from modelfleet.host.operations.report import report_path

MARK = "@@modelfleet-record"
VBIOS = "nvidia-smi --query-gpu=vbios_version --format=csv,noheader"


def script() -> str:
    return (f"echo '{MARK} os'; ( {OsRelease().command()} ) 2>/dev/null; "
            f"echo '{MARK} tools'; echo \"signer=$({MODULE_SIGNER} 2>/dev/null)\"; "
            f"echo \"fabric_manager=$({fabric_manager_version_sh()})\"; "
            f"echo \"imex=$({osfam.family(None).upstream_sh('nvidia-imex')} 2>/dev/null)\"; "
            f"echo \"vbios=$({VBIOS} 2>/dev/null | sort -u | tr '\\n' ' ')\"; echo '{MARK} end';")


def sections(output: str) -> tuple[list[str], dict[str, str]]:
    """(the OS lines, the tools' key=value) from status's output."""
    os_lines, tools, section = [], {}, None
    for line in output.splitlines():
        if line.startswith(MARK):
            section = line[len(MARK):].strip()
        elif section == "os":
            os_lines.append(line)
        elif section == "tools" and "=" in line:
            key, _, value = line.partition("=")
            tools[key] = value.strip() or None
    return os_lines, tools


def admission_report(host_name: str) -> dict | None:
    """The host's last admission report on this control node (reports/admission), None when never judged."""
    path = report_path("admission", host_name)
    return json.loads(path.read_text()) if path.exists() else None


def _admission(report: dict | None, now: float) -> dict | None:
    if report is None:
        return None
    until = report.get("valid_until")
    return {"ok": report.get("ok"), "at": report.get("admitted_at"), "valid_until": until,
            "expired": bool(report.get("ok")) and (not until or now >= until), "reasons": report.get("reasons", []),
            "nvlink_errors": report.get("nvlink_errors", [])}  # counters above 0 when it was judged


def record(plan, output: str, driver: str | None, services: list[dict], admission: dict | None,
           now: float | None = None) -> dict:
    """The host's record; `admission`: its last admission report as written (reports/admission), or None."""
    os_lines, tools = sections(output)
    os_info = OsRelease().process(os_lines) if os_lines else {}
    vbios = (tools.get("vbios") or "").split()
    return {"os": os_info.get("pretty_name"), "kernel": os_info.get("kernel"),
            "kernel_flavour": os_info.get("kernel_flavour"), "secure_boot": os_info.get("secure_boot"),
            "driver": {"branch": plan.stack.driver_branch if plan.hardware.vendor == "nvidia" else None,
                       "version": driver, "source": secure_boot.driver_source(plan.stack.driver_source, os_info)
                       if plan.hardware.vendor == "nvidia" else None, "module_signer": tools.get("signer")},
            "fabric_manager": tools.get("fabric_manager"), "imex": tools.get("imex"), "vbios": vbios,
            "pools": {s["pool"]: {"image": s.get("image"), "image_id": s.get("image_id"),
                                  "revision": s.get("revision")} for s in services},
            "admission": _admission(admission, time.time() if now is None else now)}
