"""A Prometheus scrape configuration for the fleet: every engine's /metrics, and per host the DCGM exporter
(NVIDIA GPUs, :9400) and the node exporter (:9100) where the caller says they run; labels pool, host, model,
engine. Queries for the numbers the guides watch are in README.md ("Observability")."""

from __future__ import annotations

from modelfleet.inventory import Resolved

DCGM_PORT = 9400
NODE_EXPORTER_PORT = 9100


def scrape_config(resolved: Resolved, dcgm: bool = False, node_exporter: bool = False,
                  interval_s: int = 15) -> dict:
    engines, dcgm_targets, node_targets = [], [], []
    for name, plan in resolved.hosts.items():
        for svc in plan.services:
            labels = {"pool": svc.pool, "host": name, "model": svc.model.id, "served_name": svc.served_name,
                      "engine": svc.engine_name, "node_rank": str(svc.node_rank)}
            if svc.node_rank == 0:  # headless workers serve no HTTP
                engines.append({"targets": [f"{svc.bind_address}:{svc.port}"], "labels": labels})
        pools = ",".join(sorted({s.pool for s in plan.services}))
        host_labels = {"host": name, "pool": pools, "hardware": plan.hardware.id}
        if dcgm and plan.hardware.vendor == "nvidia":
            dcgm_targets.append({"targets": [f"{plan.fabric_address}:{DCGM_PORT}"], "labels": host_labels})
        if node_exporter:
            node_targets.append({"targets": [f"{plan.fabric_address}:{NODE_EXPORTER_PORT}"], "labels": host_labels})
    jobs = [{"job_name": "modelfleet-engines", "metrics_path": "/metrics", "static_configs": engines}]
    if dcgm_targets:
        jobs.append({"job_name": "modelfleet-dcgm", "static_configs": dcgm_targets})
    if node_targets:
        jobs.append({"job_name": "modelfleet-node", "static_configs": node_targets})
    return {"global": {"scrape_interval": f"{interval_s}s"}, "scrape_configs": jobs}


def loopback_targets(resolved: Resolved) -> list[str]:
    """Engines a Prometheus on another machine cannot reach (bound to the host's loopback)."""
    return sorted(f"{name}/{svc.pool}" for name, plan in resolved.hosts.items() for svc in plan.services
                  if svc.loopback and svc.node_rank == 0)
