"""The endpoints a host has, as `show HOST` lists them: each front door it runs and each service it serves
(a replica behind a front door, or an engine clients reach directly), with its port, bind address, router, the
URL clients use and whether that URL is TLS or plain HTTP. A front door's facts are router.summary's, the ones
`validate --json` and `status --json` list."""

from __future__ import annotations

from modelfleet.plan import router
from modelfleet.plan.inventory.plan import Resolved


def rows(result: Resolved, name: str) -> list[dict]:
    """HOST's endpoints (none when the host did not resolve)."""
    plan = result.hosts.get(name)
    if plan is None:
        return []
    out = [{"endpoint": f"front door {rp.name}", **router.summary(rp)} for rp in plan.routers]
    doors = {(w.host, w.pool): (rp, w) for rp in result.routers.values() for w in rp.workers}
    for svc in plan.services:
        found = doors.get((name, svc.pool))
        row = {"endpoint": f"pool {svc.pool}", "bind_address": svc.door_address or svc.bind_address,
               "port": svc.port}
        if found:  # clients go through the front door; this is where its router reaches the replica
            rp, worker = found
            door = router.summary(rp)
            row.update({"router": door["router"], "front_door": f"{rp.name} on {rp.host}", "url": door["url"],
                        "tls": door["tls"], "replica_url": worker.url})
        elif svc.router:  # a pool member that is not the head: its head's HTTP is the replica
            row.update({"router": None, "front_door": f"{router.front_door_name(svc.served_name)} on "
                        f"{svc.router.host} (through the pool's head)", "url": None, "tls": False})
        elif svc.door_address:  # its engine holds no key: a keyed proxy of this host is its door
            row.update({"router": None, "front_door": f"keyed proxy on {name}", "url": f"{svc.router_url}/v1",
                        "tls": False})
        else:
            row.update({"router": None, "front_door": None, "url": f"{svc.base_url}/v1", "tls": False})
        out.append(row)
    return out


def lines(found: list[dict]) -> list[str]:
    """One line per endpoint, for `show`'s text output."""
    out = []
    for row in found:
        where = f"{row['bind_address']}:{row['port']}" if ":" not in row["bind_address"] else \
            f"[{row['bind_address']}]:{row['port']}"
        scheme = "TLS" if row["tls"] else "plain HTTP"
        if row["endpoint"].startswith("front door"):
            out.append(f"{row['endpoint']}  listens {where}  router {row['router']}  clients use {row['url']} "
                       f"({scheme})  replicas: {', '.join(r['url'] for r in row['replicas']) or 'none'}")
        elif row["front_door"] and row["front_door"].startswith("keyed proxy"):
            out.append(f"{row['endpoint']}  listens {where}  behind its {row['front_door']}  clients use {row['url']} "
                       f"({scheme})")
        elif row["front_door"]:
            out.append(f"{row['endpoint']}  listens {where}  replica behind front door {row['front_door']}"
                       + (f" (router {row['router']})  clients use {row['url']} ({scheme})" if row["url"] else ""))
        else:
            out.append(f"{row['endpoint']}  listens {where}  no front door  clients use {row['url']} ({scheme})")
    return out
