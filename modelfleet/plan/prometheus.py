"""A Prometheus scrape configuration for the fleet: every engine's /metrics, each front door's router metrics,
and per host the DCGM exporter (NVIDIA GPUs, :9400: where host data sets `dcgm_exporter`, or everywhere with
`--dcgm`) and the node exporter (:9100) where the caller says they run;
labels pool, host, model, engine. A target is the address the metrics listen on as the host gets it (a wildcard
bind: the host's address); one that listens on loopback only is named in `unscrapable` instead, unless the
configuration is for a Prometheus on that host (`on`). Queries for the numbers the guides watch are in
README.md ("Observability")."""

from __future__ import annotations

from modelfleet.plan import router
from modelfleet.plan.exposure import key_coverage
from modelfleet.plan.inventory.plan import Resolved, _is_loopback, _url_host

DCGM_PORT = 9400
NODE_EXPORTER_PORT = 9100
# Where the Prometheus host keeps each API key a keyed /metrics needs: one file per control-node variable.
KEY_DIR = "/etc/prometheus/modelfleet"
WILDCARDS = ("0.0.0.0", "::")


def _at(address: str, host_address: str, port: int) -> str:
    return f"{_url_host(host_address if address in WILDCARDS else address)}:{port}"


def _keyed(svc) -> str | None:
    """The variable of the key the service's /metrics asks for: its keyed proxy asks for it on every route but
    health; an engine holding the key asks for it unless key_coverage.yaml says /metrics stays open."""
    if not svc.api_key_env:
        return None
    coverage = key_coverage().get(svc.engine_name)
    open_ = coverage is not None and "/metrics" in coverage.open_routes
    return svc.api_key_env if svc.door_address or not open_ else None


def router_metrics(rp) -> tuple[str, int] | None:
    """Where the front door's router serves its Prometheus series, read from the flags its unit is given."""
    args = router.router_args(rp)
    if "--prometheus-port" not in args or "--prometheus-host" not in args:
        return None
    return args[args.index("--prometheus-host") + 1], int(args[args.index("--prometheus-port") + 1])


def targets(resolved: Resolved) -> list[dict]:
    """Every metrics endpoint the inventory's hosts get: job, host, address (as it listens), target, labels,
    key_env (a keyed /metrics), loopback; or `none` (why it has no /metrics)."""
    found = []
    for name, plan in resolved.hosts.items():
        for svc in plan.services:
            if svc.node_rank != 0:  # headless workers serve no HTTP
                continue
            labels = {"pool": svc.pool, "host": name, "model": svc.model.id, "served_name": svc.served_name,
                      "engine": svc.engine_name, "node_rank": str(svc.node_rank)}
            address = svc.door_address or svc.bind_address
            found.append({"job": "modelfleet-engines", "host": name, "what": f"pool {svc.pool}",
                          "listen": f"{_url_host(address)}:{svc.port}",
                          "target": _at(address, plan.address, svc.port), "labels": labels,
                          "key_env": _keyed(svc), "loopback": _loopback_only(address, plan.address),
                          "none": None if any(svc.engine.metrics.model_dump().values()) else
                          f"the catalogue knows no /metrics of {svc.engine_name} on its API (catalog/engines.yaml)"})
    for rp in resolved.routers.values():
        at = router_metrics(rp)
        if at is None:
            continue
        labels = {"front_door": rp.name, "host": rp.host, "served_name": rp.served_name, "router": rp.engine_name}
        found.append({"job": "modelfleet-front-doors", "host": rp.host, "what": f"front door {rp.name}",
                      "listen": f"{_url_host(at[0])}:{at[1]}", "target": _at(at[0], rp.host_address, at[1]),
                      "labels": labels, "key_env": None, "loopback": _loopback_only(at[0], rp.host_address),
                      "none": None})
    return found


def _loopback_only(address: str, reached: str) -> bool:
    """Listening on loopback, where the inventory reaches the host by another address (a host reached at a
    loopback address, as the lab's or a local one, is scraped there)."""
    return _is_loopback(address) and address != reached


def _scraped(t: dict, on: str | None) -> bool:
    return not t["none"] and (t["host"] == on if on else not t["loopback"])


def scrape_config(resolved: Resolved, dcgm: bool = False, node_exporter: bool = False, interval_s: int = 15,
                  on: str | None = None, key_dir: str = KEY_DIR) -> dict:
    """Jobs for a Prometheus on another machine, or (`on`) for one on that host, scraping its own targets
    (loopback ones included). A keyed /metrics gets a job per key, its key read from `key_dir`/VARIABLE."""
    jobs: dict[tuple[str, str | None], list[dict]] = {}
    for t in targets(resolved):
        if _scraped(t, on):
            jobs.setdefault((t["job"], t["key_env"]), []).append({"targets": [t["target"]], "labels": t["labels"]})
    dcgm_targets, node_targets = [], []
    for name, plan in resolved.hosts.items():
        if on and name != on:
            continue
        pools = ",".join(sorted({s.pool for s in plan.services}))
        host_labels = {"host": name, "pool": pools, "hardware": plan.hardware.id}
        if (dcgm or plan.dcgm_exporter) and plan.hardware.vendor == "nvidia":  # the exporters stage runs one there
            dcgm_targets.append({"targets": [f"{_url_host(plan.fabric_address)}:{DCGM_PORT}"],
                                 "labels": host_labels})
        if node_exporter:
            node_targets.append({"targets": [f"{_url_host(plan.fabric_address)}:{NODE_EXPORTER_PORT}"],
                                 "labels": host_labels})
    out = []
    for (job, key_env), configs in jobs.items():
        entry = {"job_name": job if not key_env else f"{job}-{key_env.lower().replace('_', '-')}",
                 "metrics_path": "/metrics", "static_configs": configs}
        if key_env:  # the file's path, never the key: Prometheus reads it at each scrape
            entry["authorization"] = {"type": "Bearer", "credentials_file": f"{key_dir}/{key_env}"}
        out.append(entry)
    if dcgm_targets:
        out.append({"job_name": "modelfleet-dcgm", "static_configs": dcgm_targets})
    if node_targets:
        out.append({"job_name": "modelfleet-node", "static_configs": node_targets})
    return {"global": {"scrape_interval": f"{interval_s}s"}, "scrape_configs": out}


def notes(resolved: Resolved, on: str | None = None, key_dir: str = KEY_DIR) -> list[str]:
    """What the configuration leaves out and why, and the key files its keyed jobs read."""
    out, keys = [], set()
    for t in targets(resolved):
        if on and t["host"] != on:
            continue
        if t["none"]:
            out.append(f"{t['host']}: {t['what']}: not scraped: {t['none']}")
        elif t["loopback"] and not on:
            out.append(f"{t['host']}: {t['what']}: not scraped: its metrics listen on {t['listen']} (loopback "
                       f"only): scrape them from a Prometheus or agent on {t['host']} "
                       f"(modelfleet prometheus INVENTORY --on {t['host']})")
        elif t["key_env"]:
            keys.add(t["key_env"])
    out += [f"keyed /metrics: put the key of {env} in {key_dir}/{env} on the Prometheus host, readable by "
            "Prometheus only (--key-dir changes the directory)" for env in sorted(keys)]
    return out
