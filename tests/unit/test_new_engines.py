"""TokenSpeed and Ollama as engines: what validate, plan and render accept and refuse for them, naming host (or
file) and field, before any host is touched; every listener they start on loopback or behind a keyed proxy."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from click.testing import CliRunner

from modelfleet.cli import main
from modelfleet.host import units
from modelfleet.plan import render, replica_door
from modelfleet.plan.catalog import CATALOG_DIR, CatalogError, load_catalog, with_site_recipes
from modelfleet.plan.inventory import resolve
from modelfleet.plan.inventory.endpoints import rows
from modelfleet.plan.planner import gpu_layers, layer_lines, plan_capacity
from tests.helpers.made_keys import made_key
from tests.helpers.recipe_pools import CATALOG, PIN, pool

KEY = made_key("door")


def host(engine: str, **extra) -> dict:
    recipe = {"tokenspeed": ("kimi-k3", "b300", 8, "kimi-k3-tokenspeed-b300"),
              "ollama": ("tiny-lab", "h200", 1, "tiny-lab-ollama")}[engine]
    model, hardware, gpus, recipe_id = recipe
    return {"ssh_hostname": "192.0.2.60", "hardware": hardware, "gpu_count": 8, "model": model, "engine": engine,
            "recipe": recipe_id, "revision": PIN, "gpus": gpus, **extra}


def unit_text(svc) -> str:
    return "\n".join(content for _, content, _, _ in units.unit_files(svc, mask=True))


def test_tokenspeed_listens_on_loopback_its_exporter_too_and_gets_no_key_in_its_command_line(monkeypatch):
    monkeypatch.setenv("DOOR_KEY", KEY)
    result = resolve([("t1", host("tokenspeed", api_key_env="DOOR_KEY", bind_address="10.0.0.9"))])
    assert result.errors == []
    svc = result.hosts["t1"].services[0]
    argv = render.engine_argv(svc)
    assert argv[:2] == ["serve", "/model"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert "--api-key" not in argv and KEY not in unit_text(svc) and KEY not in render.render_env(svc)


@pytest.mark.parametrize("engine", ["tokenspeed", "ollama"])
def test_off_loopback_an_engine_that_holds_no_key_sits_behind_a_keyed_proxy_of_its_host(engine, monkeypatch):
    monkeypatch.setenv("DOOR_KEY", KEY)
    result = resolve([("h1", host(engine, bind_address="10.0.0.9", api_key_env="DOOR_KEY"))])
    assert result.errors == []
    plan = result.hosts["h1"]
    svc = plan.services[0]
    assert (svc.bind_address, svc.door_address) == ("127.0.0.1", "10.0.0.9")
    assert replica_door.doors(plan) == [svc]
    conf = replica_door.render_conf(svc)
    assert f"listen 10.0.0.9:{svc.port};" in conf and f"server 127.0.0.1:{svc.port};" in conf
    assert "if ($modelfleet_refusal = 401)" in conf and KEY not in conf
    [row] = rows(result, "h1")
    assert row["url"] == f"http://10.0.0.9:{svc.port}/v1" and row["front_door"] == "keyed proxy on h1"


@pytest.mark.parametrize("engine", ["tokenspeed", "ollama"])
def test_off_loopback_without_a_key_is_refused_naming_host_and_field(engine):
    [(where, fld, message)] = resolve([("h1", host(engine, bind_address="10.0.0.9"))]).errors
    assert (where, fld) == ("host h1", "bind_address") and "set `api_key_env`" in message


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", "[::]"])
def test_a_keyed_proxy_on_every_address_is_refused(wildcard, monkeypatch):
    """The proxy on 0.0.0.0:P beside the engine on 127.0.0.1:P: the kernel refuses the second bind."""
    monkeypatch.setenv("DOOR_KEY", KEY)
    errors = resolve([("h1", host("ollama", bind_address=wildcard, api_key_env="DOOR_KEY"))]).errors
    assert [(w, f) for w, f, _ in errors] == [("host h1", "bind_address")], errors


def test_a_key_the_keyed_proxy_cannot_hold_is_refused(monkeypatch):
    monkeypatch.setenv("DOOR_KEY", "short key")
    errors = resolve([("h1", host("ollama", bind_address="10.0.0.9", api_key_env="DOOR_KEY"))]).errors
    assert [(w, f) for w, f, _ in errors] == [("host h1", "api_key_env")] and "short key" not in str(errors)


@pytest.mark.parametrize("engine", ["tokenspeed", "ollama"])
def test_a_multi_node_pool_is_refused_naming_pool_and_engine(engine):
    errors = resolve([("h1", host(engine, pool="p")), ("h2", host(engine, pool="p"))]).errors
    assert ("pool p", "engine") in [(w, f) for w, f, _ in errors]
    assert any(f"{engine} has no multi-node mode" in m for _, _, m in errors)


def test_ollama_unit_serves_the_fetched_file_from_its_store_on_the_model_root():
    svc = pool("tiny-lab-ollama", "h200").hosts["n0"].services[0]
    files = {path: content for path, content, _, _ in units.unit_files(svc)}
    unit = files[f"{units.UNIT_DIR}/{svc.unit_name}"]
    assert "ollama/ollama:0.32.15 \\\n    serve\n" in unit  # `ollama serve` takes no arguments
    assert f"-v {svc.model_dir}.ollama-store:/modelfleet-store" in unit and svc.model_dir.startswith("/srv/models")
    assert files[render.modelfile_path(svc)] == "FROM /model/tiny-lab.gguf\n"
    env = files[svc.env_file]
    assert "OLLAMA_HOST=127.0.0.1:11434\n" in env and "OLLAMA_MODELS=/modelfleet-store\n" in env
    assert "OLLAMA_KEEP_ALIVE=-1\n" in env
    assert unit.count("ExecStartPost=") == 3 and "/api/version" in unit and "create \\\n    tiny-lab" in unit
    assert "hf.co" not in unit and "pull" not in unit


def site_recipe(tmp_path, **changes):
    data = {**yaml.safe_load((CATALOG_DIR / "recipes" / "tiny-lab-ollama.yaml").read_text()),
            "id": "site-ollama", **changes}
    (tmp_path / "site-ollama.yaml").write_text(yaml.safe_dump(data))
    return with_site_recipes(load_catalog(), tmp_path)


def test_a_split_gguf_for_ollama_is_refused_with_the_reason(tmp_path):
    with pytest.raises(CatalogError) as raised:
        site_recipe(tmp_path, model="kimi-k3", gguf_quant="UD-Q4_K_XL", model_file="UD-Q4_K_XL/*-00001-of-*.gguf")
    assert raised.value.where.endswith("site-ollama.yaml")
    assert raised.value.message.startswith("model_file: UD-Q4_K_XL/*-00001-of-*.gguf is one part of a split GGUF")
    assert "ollama/ollama/issues/5245" in raised.value.message and "llama-gguf-split --merge" in raised.value.message
    assert site_recipe(tmp_path, model="kimi-k3", gguf_quant="UD-Q4_K_XL", model_file="UD-Q4_K_XL/merged.gguf")


def test_experts_in_ram_for_ollama_are_refused_pointing_at_llama_cpp(tmp_path):
    with pytest.raises(CatalogError, match=r"args: --cpu-moe keep MoE experts in host RAM, which ollama cannot do: "
                                           r"it offloads whole layers \(num_gpu\); serve this with engine llama.cpp"):
        site_recipe(tmp_path, args=["--cpu-moe"])
    with pytest.raises(CatalogError, match="args: ollama's server takes no arguments"):
        site_recipe(tmp_path, args=["--ctx-size", "4096"])
    [(where, fld, message)] = resolve([("h1", host("ollama", extra_args=["-ot", ".ffn_.*_exps.=CPU"]))]).errors
    assert (where, fld) == ("host h1", "extra_args") and "-ot keep MoE experts in host RAM" in message
    assert "llama.cpp" in message


def merged_k3_on_h200():
    """Kimi K3's IQ1_M GGUF, merged into one file, on one H200, with a layer count to size by (the catalog has
    none for K3: 61, as DeepSeek-V3-style models have)."""
    recipe = CATALOG.recipes["tiny-lab-ollama"].model_copy(update={
        "id": "k3-ollama", "model": "kimi-k3", "gguf_quant": "UD-IQ1_M", "model_file": "UD-IQ1_M/merged.gguf"})
    return CATALOG.models["kimi-k3"].model_copy(update={"layers": 61}), CATALOG.hardware["h200"], recipe


def test_the_planner_sizes_ollamas_gpu_layers_and_the_rest_goes_to_host_ram():
    model, h200, recipe = merged_k3_on_h200()
    per_layer = 649.0e9 * 1.15 / 61
    room = 143771 * 2**20 * 0.9 - 2**30
    assert gpu_layers(model, h200, 1, recipe) == (int(room // per_layer), 61) == (11, 61)
    report = plan_capacity(model, h200, 1, recipe=recipe)
    assert report.fits and report.reason.startswith("fits by layer: 11 of 61 layers on the GPUs")
    assert not plan_capacity(model, h200, 1, recipe=recipe, host_ram_gib=256).fits
    # Ollama keeps its own copy of the file it registers beside each revision on disk (served + 1 kept).
    assert report.disk_needed_bytes == pytest.approx(649.0e9 * (2 + 0.05 + 2))
    # Three revisions kept for rollback: four revisions on disk, each with its store.
    kept = plan_capacity(model, h200, 1, recipe=recipe, keep_revisions=3)
    assert kept.disk_needed_bytes == pytest.approx(649.0e9 * (4 + 0.05 + 4))
    lines = layer_lines(report, model, h200, recipe)
    assert lines[0] == "ollama offloads whole layers, not MoE experts: 11 of 61 layers on the GPUs (num_gpu 11), " \
                       "the rest in host RAM"
    assert lines[1].startswith("caveat (the GGUF guide): ollama does not shrink the memory requirement")


def test_plan_shows_the_caveat_for_an_ollama_recipe():
    out = CliRunner().invoke(main, ["plan", "--model", "tiny-lab", "--hardware", "h200", "--gpus", "1",
                                    "--recipe", "tiny-lab-ollama"])
    assert out.exit_code == 0, out.output
    assert "ollama offloads whole layers, not MoE experts" in out.output
    assert "ollama does not shrink the memory requirement" in out.output


def test_ollama_modelfile_carries_the_sized_layers(monkeypatch):
    model, h200, recipe = merged_k3_on_h200()
    svc = pool("tiny-lab-ollama", "h200").hosts["n0"].services[0]
    svc = svc.__class__(**{**svc.__dict__, "model": model, "recipe": recipe, "model_file": recipe.model_file})
    assert render.render_modelfile(svc) == "FROM /model/UD-IQ1_M/merged.gguf\nPARAMETER num_gpu 11\n"


@pytest.mark.parametrize("spec, field", [
    ({"argv": ["serve"]}, "give host_flag, port_flag and served_name_flag, or address_env"),
    ({"argv": ["serve"], "address_env": "OLLAMA_HOST", "registration": {"source": "x", "command": ["c"]}},
     "registration.load_path"),
    ({"argv": ["serve"], "address_env": "OLLAMA_HOST", "layer_offload": {"parameter": "num_gpu"}},
     "layer_offload.source"),
])
def test_a_bad_engine_entry_is_refused_naming_engine_and_field(tmp_path, spec, field):
    root = tmp_path / "catalog"
    shutil.copytree(CATALOG_DIR, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    entries = yaml.safe_load((root / "engines.yaml").read_text())
    entries["new"] = {"source": "s", "entrypoint": "e", "default_port": 1, "metrics": {}, "boot_log": None, **spec}
    (root / "engines.yaml").write_text(yaml.safe_dump(entries))
    with pytest.raises(CatalogError, match=rf"engine new: .*{field}"):
        load_catalog.__wrapped__(root)


def test_verify_asks_the_keyed_proxy_where_clients_do_and_its_health_path_stays_open(monkeypatch):
    """The gate and the exposure probe go to the keyed proxy (not the keyless engine on loopback), which leaves
    only the engine's health path open: a key-less request to it is answered, every other one is refused."""
    from modelfleet.run.checks import endpoint, reachable_from_control_node

    monkeypatch.setenv("DOOR_KEY", KEY)
    result = resolve([("h1", host("ollama", bind_address="10.0.0.9", api_key_env="DOOR_KEY"))])
    plan = result.hosts["h1"]
    svc = plan.services[0]
    ep = endpoint(plan, svc)
    assert ep.base_url == "http://10.0.0.9:11434" and reachable_from_control_node(plan, svc)
    assert '"~^/api/version(\\?|$)" 1;' in replica_door.render_conf(svc)
    assert "location = /health {" not in replica_door.render_conf(svc)


def test_a_key_on_loopback_for_an_engine_that_holds_none_is_refused(monkeypatch):
    monkeypatch.setenv("DOOR_KEY", KEY)
    [(where, fld, message)] = resolve([("h1", host("tokenspeed", api_key_env="DOOR_KEY"))]).errors
    assert (where, fld) == ("host h1", "api_key_env") and "tokenspeed holds no key" in message


def test_a_pruned_revision_takes_the_store_it_was_registered_in_with_it(tmp_path):
    """Ollama's store keeps a copy of the revision's file beside it (render.store_dir): pruning the revision
    removes that copy too (the shell expands the pattern), and nothing of the revision kept."""
    import subprocess

    from modelfleet.run.stages.model import revisions_pruned

    old, kept = "a" * 40, "b" * 40
    svc = pool("tiny-lab-ollama", "h200").hosts["n0"].services[0]
    assert render.store_dir(svc) == f"{svc.model_dir}.ollama-store"
    for name in (old, f"{old}.ollama-store", kept, f"{kept}.ollama-store"):
        (tmp_path / name).mkdir()
    [command] = list(revisions_pruned._inner(parent=str(tmp_path), remove=[old]))
    subprocess.run(["sh", "-c", str(command)], check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept, f"{kept}.ollama-store"]


def test_the_env_may_not_move_ollamas_address_or_store():
    errors = resolve([("h1", host("ollama", env={"OLLAMA_HOST": "0.0.0.0:11434", "OLLAMA_MODELS": "/tmp/x"}))]).errors
    assert [(w, f) for w, f, _ in errors] == [("host h1", "env.OLLAMA_HOST"), ("host h1", "env.OLLAMA_MODELS")]
    assert all("set by modelfleet for ollama" in m for _, _, m in errors)


def test_the_env_may_set_nothing_modelfleet_sets_for_ollama():
    """OLLAMA_KEEP_ALIVE (modelfleet keeps the registered model loaded: -1) in the inventory's env was
    overwritten in silence: every variable render.address_env sets is refused, naming host and field."""
    svc = resolve([("h1", host("ollama"))]).hosts["h1"].services[0]
    own = render.address_env(svc)
    assert "OLLAMA_KEEP_ALIVE" in own
    errors = resolve([("h1", host("ollama", env={key: "5m" for key in own}))]).errors
    assert [(w, f) for w, f, _ in errors] == [("host h1", f"env.{key}") for key in sorted(own)], errors
    assert all("set by modelfleet for ollama" in m for _, _, m in errors)
    assert set(own) == set(svc.engine.own_env())  # one list: what render sets is what validate refuses
    assert resolve([("h1", host("ollama", env={"OLLAMA_FLASH_ATTENTION": "1"}))]).errors == []


@pytest.mark.parametrize("served,listed", [("tiny", "tiny:latest"), ("tiny:q4", "tiny:q4"),
                                           ("site.example:5000/team/tiny", "site.example:5000/team/tiny:latest")])
def test_readiness_waits_for_the_name_ollama_lists(served, listed):
    """Ollama adds `:latest` only to a name without a tag: readiness and verify wait for `tiny:q4` itself."""
    result = resolve([("h1", host("ollama", served_name=served))])
    assert result.errors == []
    svc = result.hosts["h1"].services[0]
    assert render.listed_name(svc) == listed


def test_tokenspeeds_control_server_port_is_held_apart_from_other_services():
    """`tokenspeed serve` also listens on port + 1 (its control server): a service of the host there is refused."""
    data = host("tokenspeed", services=[{"port": 8000}, {"model": "kimi-k3", "engine": "tokenspeed",
                                                        "recipe": "kimi-k3-tokenspeed-b300", "port": 8001,
                                                        "pool": "second", "gpus": 8}], gpu_count=16)
    ports = [m for w, f, m in resolve([("h1", data)]).errors if f == "port"]
    assert ports and ports[0].startswith("8001 is used by pools") and "at port + 1" in ports[0]


def test_render_shows_the_keyed_proxy_the_run_writes_with_its_key_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("DOOR_KEY", KEY)
    data = host("ollama", bind_address="10.0.0.9", api_key_env="DOOR_KEY")
    (tmp_path / "inv.py").write_text(f"hosts = [('h1', {data!r})]\n")
    out = CliRunner().invoke(main, ["render", "--json", str(tmp_path / "inv.py"), "h1"])
    assert out.exit_code == 0, out.output
    shown = {f["path"]: f["content"] for f in json.loads(out.output)["files"]}
    svc = resolve([("h1", data)]).hosts["h1"].services[0]
    for path, content, _, secret in replica_door.files(svc, KEY):
        assert (shown[path] == content) != secret  # the same file; the key map only masked
    assert KEY not in out.output


def test_tokenspeeds_control_server_port_is_held_apart_from_a_front_door_on_its_host(monkeypatch):
    """A front door on the host of a TokenSpeed service: its port may not be the engine's control server
    (port + 1), which the front door's check and the host's claims name alike."""
    monkeypatch.setenv("DOOR_KEY", KEY)
    gateway = ("gw", host("tokenspeed", port=8799))
    replica = ("a", {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "sglang", "recipe": "tiny-lab-sglang",
                     "ssh_hostname": "192.0.2.61", "fabric_address": "192.0.2.61", "router": "gw",
                     "api_key_env": "DOOR_KEY"})
    errors = resolve([gateway, replica]).errors
    assert [(w, f) for w, f, _ in errors] == [("router tiny-lab", "router_port")], errors
    assert "port 8800 (the front door) is used by pool " in errors[0][2] and "at port + 1" in errors[0][2]
    assert resolve([gateway, (replica[0], {**replica[1], "router_port": 8810})]).errors == []


def test_tokenspeeds_control_server_port_is_a_claimed_port_of_its_host():
    """A prefill server's bootstrap port on TokenSpeed's control server port (port + 1) of the same host."""
    from modelfleet.plan.catalog.routers import bootstrap_port

    taken = bootstrap_port(CATALOG.recipes["kimi-k3-sglang-pd-prefill-b300"], "sglang")
    data = host("tokenspeed", gpu_count=16, services=[
        {"port": taken - 1, "pool": "ts"},
        {"engine": "sglang", "recipe": "kimi-k3-sglang-pd-prefill-b300", "port": 30000, "pool": "prefill"}])
    found = [(f, m) for w, f, m in resolve([("h1", data)]).errors if "one overwriting the other" in m]
    assert found and f"port {taken} would be taken by both pool ts (its engine)" in found[0][1], found
