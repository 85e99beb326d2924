"""A keyed proxy before a routed replica on its own host: where a replica's engine leaves a model route open
without its key (vLLM's /invocations, catalog/key_coverage.yaml) and the replica sits on another host than its
router, the engine listens on loopback and the front door's proxy (Debian's nginx, the same key map) listens on
the replica's fabric address and port, every route but /health keyed; the router reaches the replica there with
the model's key (its --api-key, which it sends to its workers). Pure: paths and files; modelfleet.run.stages.router
puts them on the host."""

from __future__ import annotations

import re

from modelfleet.plan import render
from modelfleet.plan.inventory.plan import ServicePlan, _url_host
from modelfleet.plan.router import NGINX, UNIT_DIR, proxy_key_conf


def unit_name(svc: ServicePlan) -> str:
    return f"modelfleet-door-replica-{svc.pool}.service"


def paths(svc: ServicePlan) -> dict[str, str]:
    base = f"{svc.config_dir}/door-replica-{svc.pool}"
    return {"conf": f"{base}.conf", "key": f"{base}.key.conf", "unit": f"{UNIT_DIR}/{unit_name(svc)}"}


def listen(svc: ServicePlan) -> str:
    return f"{_url_host(svc.door_address)}:{svc.port}"


def render_conf(svc: ServicePlan, runtime: str | None = None) -> str:
    return render.render_template("replica_door.nginx.conf.j2", svc=svc, listen=listen(svc),
                                  runtime=runtime or f"/run/modelfleet-door-replica-{svc.pool}",
                                  key_conf=paths(svc)["key"], backend=f"127.0.0.1:{svc.port}",
                                  health_pattern=re.escape(svc.engine.health_path))


def render_unit(svc: ServicePlan) -> str:
    return render.render_template("replica_door.service.j2", svc=svc, nginx=NGINX, conf=paths(svc)["conf"],
                                  name=unit_name(svc).removesuffix(".service"), front=listen(svc))


def files(svc: ServicePlan, key: str) -> list[tuple[str, str, str, bool]]:
    """(path, content, mode, secret) of every file the proxy needs; the key only in the 0600 map."""
    p = paths(svc)
    return [(p["key"], proxy_key_conf(key), "0600", True), (p["conf"], render_conf(svc), "0644", False),
            (p["unit"], render_unit(svc), "0644", False)]


def preview(svc: ServicePlan) -> list[dict]:
    """The proxy's files as `render` shows them: the key map with the key masked (the run writes the key)."""
    p = paths(svc)
    masked = (f"# {svc.api_key_env}\nmap $http_authorization $modelfleet_authorized {{\n    default 0;\n"
              f'    "~^Bearer {render.MASK}$" 1;\n}}\n')
    return [{"path": p["key"], "mode": "0600", "content": masked},
            {"path": p["conf"], "mode": "0644", "content": render_conf(svc)},
            {"path": p["unit"], "mode": "0644", "content": render_unit(svc)}]


def doors(plan) -> list[ServicePlan]:
    """The host's replicas that sit behind a keyed proxy of their own."""
    return [svc for svc in plan.services if svc.door_address and not svc.node_rank]
