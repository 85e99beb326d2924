"""Prefill/decode (PD) layouts of Kimi K3 on 8xB300: a prefill pool and a decode pool behind the engine's router in
PD mode. A server's part is read from its recipe's flags (vLLM NixlConnector's kv_role, SGLang's
--disaggregation-mode); the router's PD flags are held to its recorded help and, where the router's wheel is in the
cache, to its own parser; the servers' fabric values (own address, derived HCAs) to the real engine parsers. The KV
transfer itself needs RDMA hardware and is not run here."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

import lab.engine_parsers as engine_parsers
from modelfleet.host import fabric as fab
from modelfleet.host.facts.fabric import parse_fabric
from modelfleet.plan import render, router
from modelfleet.plan.inventory import resolve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HELP = {"vllm": "vllm-router-0.1.17-help.txt", "sglang": "smg-1.13.0-launch-help.txt"}
PIN = "d" * 40
KEY = "pd-front-door-key-0123"
RAILS = [f"mlx5_{i}" for i in range(10, 18)]


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("MF_PD_KEY", KEY)


def server(engine: str, part: str | None, address: str, **extra) -> dict:
    recipe = f"kimi-k3-{engine}-pd-{part}-b300" if part else f"kimi-k3-{engine}-b300"
    return {"hardware": "b300", "model": "kimi-k3", "engine": engine, "recipe": recipe, "revision": PIN,
            "pool": f"k3-{part or 'plain'}", "ssh_hostname": f"192.0.2.{address.rsplit('.', 1)[1]}",
            "fabric_address": address, "router": "p1", "api_key_env": "MF_PD_KEY",
            **({"recipe_params": {"mamba_full_memory_ratio": 0.5}} if engine == "sglang" else {}), **extra}


def pd_pair(engine: str, **extra) -> list:
    return [("p1", server(engine, "prefill", "10.0.0.11", **extra)),
            ("d1", server(engine, "decode", "10.0.0.12", **extra))]


def options(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_prefill_and_a_decode_pool_sit_behind_one_router_in_pd_mode(engine):
    result = resolve(pd_pair(engine))
    if engine == "vllm":  # planned, but refused: vLLM's key leaves /invocations open on each server's fabric address
        assert [(w, f) for w, f, _ in result.errors] == [("host p1", "router"), ("host d1", "router")]
        assert all("/invocations" in m and "until a keyed proxy sits before each server" in m for _, _, m in
                   result.errors)
    else:
        assert result.errors == [], result.errors
    rp = result.routers["kimi-k3"]
    port = result.hosts["p1"].services[0].port
    assert rp.pd and [(w.url, w.role) for w in rp.workers] == [
        (f"http://10.0.0.11:{port}", "prefill"), (f"http://10.0.0.12:{port}", "decode")]
    # The prefill server beside the router listens on the fabric too: the decode side reaches it there.
    assert {n: h.services[0].bind_address for n, h in result.hosts.items()} == {"p1": "10.0.0.11", "d1": "10.0.0.12"}
    bootstrap = ["8998"] if engine == "sglang" else []
    flag = "--pd-disaggregation" if engine == "sglang" else "--vllm-pd-disaggregation"
    assert router.router_args(rp)[-5 - len(bootstrap):] == [
        flag, "--prefill", f"http://10.0.0.11:{port}", *bootstrap, "--decode", f"http://10.0.0.12:{port}"]
    help_text = (FIXTURES / "router" / HELP[engine]).read_text()
    flags = {a for a in router.router_args(rp) if a.startswith("--")}
    assert flags <= options(help_text), flags - options(help_text)
    # The servers are its flags: no --worker-urls and no registration through the worker API at start.
    config = json.loads(router.launcher_config(rp))
    assert "worker_urls_flag" not in config and "register" not in config


@pytest.mark.slow
@pytest.mark.parametrize("engine, module", [("vllm", "vllm_router.launch_router"),
                                            ("sglang", "sglang_router.launch_router")])
def test_the_real_router_parses_the_pd_front_doors_launch(engine, module):
    from lab.engine_parsers import cache_root

    rp = resolve(pd_pair(engine)).routers["kimi-k3"]
    spec = router.spec(rp)
    python = cache_root() / f"router-{spec.package}-{spec.version}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{spec.package} {spec.version} is not in the cache (the router e2e tests build it)")
    config = json.loads(router.launcher_config(rp))
    argv = config["args"] + [config["api_key_flag"], "not-the-key"]  # what the launcher hands the parser
    script = (f"import json, sys; from {module} import parse_router_args; a = parse_router_args(json.loads("
              "sys.argv[1])); print(json.dumps([a.prefill_urls, a.decode_urls, a.policy]))")
    done = subprocess.run([str(python), "-c", script, json.dumps(argv)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    port = 30000 if engine == "sglang" else 8000
    bootstrap = 8998 if engine == "sglang" else None
    assert json.loads(done.stdout.splitlines()[-1]) == [[[f"http://10.0.0.11:{port}", bootstrap]],
                                                        [f"http://10.0.0.12:{port}"], "cache_aware"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_model_with_one_part_only_is_refused_naming_model_and_field(engine):
    prefill, decode = pd_pair(engine)
    for alone, part, lacks in ((prefill, "prefill", "decode"), (decode, "decode", "prefill")):
        errors = [e for e in resolve([(alone[0], {**alone[1], "router": alone[0]})], offline=True).errors
                  if e[:2] != (f"host {alone[0]}", "router")]  # vLLM's open routes on the fabric: refused too
        [(where, fld, message)] = errors  # the model's error only, not again for its router
        assert (where, fld) == ("model kimi-k3", "recipe")
        assert f"the {part} part of a prefill/decode layout runs on k3-{part} (kimi-k3-{engine}-pd-{part}-b300)" \
            in message and f"no pool serving kimi-k3 runs its {lacks} part" in message


def test_each_part_behind_another_router_is_refused_for_the_router():
    prefill, (name, decode) = pd_pair("sglang")
    problems = [(w, f) for w, f, _ in resolve([prefill, (name, {**decode, "router": "d1"})]).errors]
    assert problems == [("router kimi-k3", "router"), ("router kimi-k3", "router")]


def test_a_front_door_does_not_mix_pd_pools_with_plain_replicas():
    entries = [*pd_pair("vllm"), ("x1", server("vllm", None, "10.0.0.13"))]
    problems = [(w, f) for w, f, m in resolve(entries).errors]
    assert problems == [("router kimi-k3", "recipe")]


def test_pd_pools_without_a_router_are_warned_and_their_recipes_are_never_picked_implicitly():
    result = resolve([(n, {**d, "router": None, "api_key_env": None}) for n, d in pd_pair("sglang")])
    assert result.errors == []
    assert {(w, f) for w, f, _ in result.warnings} >= {("pool k3-prefill", "router"), ("pool k3-decode", "router")}
    plain = {"hardware": "b300", "model": "kimi-k3", "engine": "sglang", "revision": PIN,
             "recipe_params": {"mamba_full_memory_ratio": 0.5}}
    assert resolve([("s", plain)]).hosts["s"].services[0].recipe.id == "kimi-k3-sglang-b300"


def with_fabric(result):
    """The pair's fabric as the fabric derivation gives it from the B300 dumps (prefill host first)."""
    pool = fab.derive("pd", [(result.hosts[name], parse_fabric((FIXTURES / "fabric" / dump).read_text().splitlines()))
                             for name, dump in (("p1", "b300-head.txt"), ("d1", "b300-worker.txt"))])
    assert pool.errors == []
    return {name: replace(result.hosts[name].services[0], fabric=pool.hosts[name]) for name in ("p1", "d1")}


def test_vllm_servers_get_their_own_address_for_nixl_and_the_derived_hcas_for_ucx():
    result = resolve(pd_pair("vllm"))
    env = {name: render.env_values(svc) for name, svc in with_fabric(result).items()}
    assert env["d1"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.12"
    assert env["p1"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.11"
    assert env["d1"]["UCX_NET_DEVICES"] == ",".join(f"{h}:1" for h in RAILS)
    # Without a derived fabric (a pool of one host): its own address still, the devices left to UCX.
    bare = render.env_values(result.hosts["d1"].services[0])
    assert bare["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.12" and "UCX_NET_DEVICES" not in bare
    assert "--kv-transfer-config" in render.engine_argv(result.hosts["d1"].services[0])


def test_sglang_servers_get_the_derived_hcas_as_their_ib_device():
    result = resolve(pd_pair("sglang"))
    argv = render.engine_argv(with_fabric(result)["p1"])
    assert argv[argv.index("--disaggregation-ib-device") + 1] == ",".join(RAILS)
    assert argv[argv.index("--disaggregation-mode") + 1] == "prefill"
    assert "--disaggregation-ib-device" not in render.engine_argv(result.hosts["p1"].services[0])
    assert not any(k.startswith(("VLLM_NIXL", "UCX_")) for k in render.env_values(with_fabric(result)["p1"]))


@pytest.mark.slow  # the real parsers, in their own interpreter
def test_the_fabric_rendered_servers_pass_the_real_engine_parsers():
    if not engine_parsers.built():
        pytest.skip("the engine parsers' environment is not built: make engine-parsers")
    items = [{"id": f"{engine}/{name}", "engine": engine, "argv": render.engine_argv(svc),
              "files": {render.CONTAINER_SECRETS: render.render_secrets_config(svc, mask=True)}
              if svc.engine.api_key_config_file else {}}
             for engine in ("vllm", "sglang") for name, svc in with_fabric(resolve(pd_pair(engine))).items()]
    done = subprocess.run([str(engine_parsers.python()), str(engine_parsers.CHECK), "argvs"], text=True,
                          input=json.dumps(items), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["id"]: r for r in json.loads(done.stdout)["results"]}
    assert all(r["ok"] for r in results.values()), {i: r["error"] for i, r in results.items() if not r["ok"]}
    assert set(results) == {"vllm/p1", "vllm/d1", "sglang/p1", "sglang/d1"}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_pd_front_door_is_never_changed_through_its_worker_api(engine):
    rp = resolve(pd_pair(engine)).routers["kimi-k3"]
    for script in (router.add_script(rp, "http://10.0.0.13:8000"),
                   router.remove_script(rp, rp.workers[0].url, rp.workers[0].url)):
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)
        assert done.returncode == 1 and "pairs prefill and decode servers given when it starts" in done.stderr
