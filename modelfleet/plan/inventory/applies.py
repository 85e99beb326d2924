"""No setting vanishes: each setting of the schema declares where it can apply (`applies(scope)` in its field),
and a value other than its default where the scope does not hold is refused, naming the host and the field,
instead of being dropped in silence (an NVIDIA setting on an AMD host, a GPU setting on the router-only board,
a front door's setting on a service with no `router`)."""

from __future__ import annotations

from pydantic import BaseModel

from modelfleet.plan.inventory.schema import SERVICE_KEYS, ServiceData

# scope -> (who it applies to, in the error's words)
SCOPES = {
    "nvidia": "NVIDIA hosts",
    "amd": "AMD hosts",
    "gpu": "hosts with GPUs",
    "model": "hosts that serve a model (not router_only)",
    "router": "a service with a front door (`router` set)",
    # Known once every host is resolved (a service of any host names the front door's host in `router`).
    "front_door": "hosts that run a front door (a service names them in `router`)",
    "open_router": "hosts that run a front door whose router checks no key itself (vLLM's)",
}
DOOR_SCOPES = {"front_door", "open_router"}


UNUSED = "set, but "  # how each of this module's problems starts


def scope_of(model: type[BaseModel], name: str) -> str | None:
    extra = model.model_fields[name].json_schema_extra
    return extra.get("applies") if isinstance(extra, dict) else None


def _given(value: BaseModel, name: str) -> bool:
    """Set by the inventory to ask for something: not the default (a default written out changes nothing), and
    not off (`admission: False` where there is nothing to admit turns off what is not there), unless the
    setting is declared strict (off is what it asks for)."""
    setting = getattr(value, name)
    extra = type(value).model_fields[name].json_schema_extra
    strict = isinstance(extra, dict) and extra.get("strict")
    return name in value.model_fields_set and setting != type(value).model_fields[name].default and \
        (bool(setting) or bool(strict))


def host_scopes(vendor: str) -> set[str]:
    """The scopes that hold on a host whose board's GPU vendor is `vendor` (`none`: no GPUs)."""
    return {"nvidia", "gpu"} if vendor == "nvidia" else {"amd", "gpu"} if vendor == "amd" else set()


def unused(value: BaseModel, holding: set[str], where: str, what: str) -> list[tuple[str, str, str]]:
    """(where, field, reason) for each setting `value` gives whose scope is not in `holding`; `what` says what
    the host or service is (`an AMD host (mi355x)`)."""
    out = []
    for name in type(value).model_fields:
        scope = scope_of(type(value), name)
        if scope and scope not in holding and scope in SCOPES and _given(value, name):
            hint = "set `router`, or take it out" if scope == "router" else \
                "take it out (a group's value reaches every host of the group: set it on the group of the hosts " \
                "it is for)"
            out.append((where, name, f"{UNUSED}{what}: {name} applies only to {SCOPES[scope]}, so it would be "
                                     f"ignored here; {hint}"))
    return out


def host_problems(host: BaseModel, hardware, where: str) -> list[tuple[str, str, str]]:
    """The host-level settings that cannot apply to the host's board (vendor, GPUs)."""
    if hardware is None:
        return []
    vendor, serves = hardware.vendor, not getattr(host, "router_only", False)
    what = {"nvidia": "an NVIDIA host", "amd": "an AMD host"}.get(vendor, "a host without GPUs")
    if not serves:
        what = "a router_only host without GPUs"
    # The front doors' scopes are judged once every host is resolved (door_problems).
    return unused(host, host_scopes(vendor) | ({"model"} if serves else set()) | DOOR_SCOPES, where,
                  f"this is {what} ({hardware.id} board)")


def door_problems(host: BaseModel, holding: set[str], where: str) -> list[tuple[str, str, str]]:
    """A front door's host settings on a host without one (`holding`: the DOOR_SCOPES that hold there, from
    modelfleet.plan.inventory.routed.door_scopes)."""
    what = "its front doors' routers check keys themselves" if "front_door" in holding else \
        "no service names this host in `router` (it runs no front door)"
    return unused(host, holding | (set(SCOPES) - DOOR_SCOPES), where, what)


def service_problems(service: BaseModel, where: str) -> list[tuple[str, str, str]]:
    """A service's settings that need what it lacks (a front door's settings without `router`)."""
    holding = {"router"} if getattr(service, "router", None) else set()
    return unused(service, holding, where, "the service names no `router` (it has no front door)")


def fleet_wide(problems: list[tuple[str, str, str]], sources: dict[str, dict[str, str]]
               ) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(errors, warnings): a setting that cannot apply, given to the whole fleet (`--data`, group_data/all.py),
    is meant for the hosts where it applies: said as a warning there, refused where a host or its own group
    gives it."""
    errors, warnings = [], []
    for problem in problems:
        where, fld, message = problem
        origin = sources.get(where.removeprefix("host "), {}).get(fld, "")
        fleet_wide_origin = origin == "--data" or origin.endswith("group_data/all.py")
        if message.startswith(UNUSED) and " applies only to " in message and fleet_wide_origin:
            warnings.append((where, fld, message.replace("; take it out (a group's value", "; (the whole fleet's "
                                                         "value, kept for the hosts it applies to; a group's value")))
        else:
            errors.append(problem)
    return errors, warnings


def router_only_problems(data: dict, where: str) -> list[tuple[str, str, str]]:
    """A router-only host serves no model: a service setting given to it (an engine, a port, extra_args, a
    router of its own) would be ignored. `model` and `services` are router_only's own refusals."""
    out = []
    for name in SERVICE_KEYS:
        if name == "model" or name not in data:
            continue
        value, default = data[name], ServiceData.model_fields[name].default
        if value != default and value not in (None, [], {}, False, 0, ""):
            out.append((where, name, f"{UNUSED}this host is router_only (it serves no model): {name} applies only "
                                     "to a host that serves a model, so it would be ignored here; take it out (a "
                                     "group's value reaches every host of the group: move the host out of it)"))
    return out
