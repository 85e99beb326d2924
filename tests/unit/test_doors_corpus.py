"""Issue 40's corpus, by door and by class of defence: every input door (a site recipe's every field, `--data`,
group_data, `services` entries, the inventory's top level, CLI options) refused with exit 2, no traceback, the
file or host named and the field; flags modelfleet manages unreachable by any spelling the engine's parser
accepts; and the injections the grammar lets through (spaces, quotes, `$`, `%`, `;`) stay one argument of one
line in what is written to the host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from modelfleet.cli import main
from modelfleet.plan import render
from modelfleet.plan.catalog import CATALOG_DIR, load_catalog
from modelfleet.plan.inventory.door import open_inventory

SHIPPED = yaml.safe_load((CATALOG_DIR / "recipes" / "qwen3-8b-vllm-1gpu.yaml").read_text())
SITE = {**SHIPPED, "id": "site-qwen", "hardware": ["h200"]}
@pytest.fixture(autouse=True)
def no_host_is_reached(monkeypatch):
    """The corpus's hosts are documentation addresses: `upgrade --dry` reads what a host runs now over SSH, and no
    test here may try one."""
    from modelfleet.fleet import status as fleet_status

    monkeypatch.setattr(fleet_status, "status", lambda plans: [])


HOST = {"ssh_hostname": "192.0.2.10", "hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm"}


def inventory(tmp_path: Path, hosts: list, recipe: dict | None = None, tail: str = "",
              group_data: dict | None = None) -> Path:
    inv = tmp_path / "site" / "inv.py"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(f"hosts = {hosts!r}\n{tail}")
    if recipe is not None:
        (inv.parent / "recipes").mkdir(exist_ok=True)
        (inv.parent / "recipes" / "site.yaml").write_text(yaml.safe_dump(recipe))
    for name, text in (group_data or {}).items():
        (inv.parent / "group_data").mkdir(exist_ok=True)
        (inv.parent / "group_data" / f"{name}.py").write_text(text)
    return inv


def refused(args: list[str]) -> list[dict]:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return json.loads(result.stdout)["errors"] if "--json" in args else [{"message": result.output}]


def site_recipe(**changes) -> dict:
    recipe = {**SITE, **changes}
    return {k: v for k, v in recipe.items() if v is not ...}


# (class, case, the recipe's change, the field the error names). Each is a site recipe a host names.
RECIPE_CASES = [
    ("single-line text", "source newline", {"source": "guide\nExecStartPre=/bin/sh -c id"}, "source"),
    ("single-line text", "notes newline", {"notes": "a\nExecStartPre=/bin/sh"}, "notes"),
    ("single-line text", "parameter where", {"parameters": {"x": {"flag": "--seed", "where": "a\nb"}}},
     "parameters.x.where"),
    ("identifier", "id with a path", {"id": "../etc/x"}, "id"),
    ("identifier", "id with a newline", {"id": "site\nqwen"}, "id"),
    ("identifier", "hardware entry", {"hardware": ["h200; reboot"]}, "hardware.0"),
    ("identifier", "no hardware", {"hardware": []}, "hardware"),
    ("identifier", "gguf quant", {"gguf_quant": "Q4 --x"}, "gguf_quant"),
    ("image reference", "image as a docker flag", {"image": "--privileged"}, "image"),
    ("image reference", "image with a space", {"image": "vllm/vllm-openai:v0.34.0 --privileged"}, "image"),
    ("image reference", "image without a tag", {"image": "vllm/vllm-openai"}, "image"),
    ("path under a root", "model_file escapes", {"model_file": "../../../../etc/shadow"}, "model_file"),
    ("path under a root", "model_file absolute", {"model_file": "/etc/shadow"}, "model_file"),
    ("path under a root", "model_file option", {"model_file": "-rf"}, "model_file"),
    ("bounded number", "negative tp", {"layout": {**SITE["layout"], "tp": -1}}, "layout.tp"),
    ("bounded number", "zero nodes", {"layout": {**SITE["layout"], "nodes": 0}}, "layout.nodes"),
    ("bounded number", "gpus per node", {"layout": {**SITE["layout"], "gpus_per_node": 1000}}, "layout.gpus_per_node"),
    ("bounded number", "negative ready timeout", {"ready_timeout_s": -1}, "ready_timeout_s"),
    ("bounded number", "week-long ready timeout", {"ready_timeout_s": 7 * 86400}, "ready_timeout_s"),
    ("fraction", "memory fraction above 1", {"memory_fraction": 1.5}, "memory_fraction"),
    ("fraction", "memory fraction zero", {"memory_fraction": 0}, "memory_fraction"),
    ("version", "min_driver r580", {"min_driver": "r580"}, "min_driver"),
    ("version", "engine_version newline", {"engine_version": "0.34.0\nX=1"}, "engine_version"),
    ("version", "cuda command", {"cuda": "13.0; id"}, "cuda"),
    ("docker option", "option that does not exist", {"docker": {"privileged": "true"}}, "docker.privileged"),
    ("docker option", "shm size flag", {"docker": {"shm_size": "1g --privileged"}}, "docker"),
    ("docker option", "ipc", {"docker": {"ipc": "host\n"}}, "docker"),
    ("env", "visible devices", {"env": {"CUDA_VISIBLE_DEVICES": "0,1"}}, "env"),
    ("env", "name with a space", {"env": {"A B": "1"}}, "env"),
    ("env", "value newline", {"env": {"A": "1\nLD_PRELOAD=/tmp/x.so"}}, "env"),
    ("flag list", "arg newline", {"args": ["--seed", "1\nExecStartPre=/bin/sh"]}, "args"),
    ("flag list", "--host", {"args": ["--host", "0.0.0.0"]}, "args"),
    ("flag list", "--ho prefix", {"args": ["--ho", "0.0.0.0"]}, "args"),
    ("flag list", "--api-k prefix", {"args": ["--api-k", "k"]}, "args"),
    ("flag list", "--port=", {"args": ["--port=1"]}, "args"),
    ("flag list", "underscore spelling", {"args": ["--api_key", "k"]}, "args"),
    ("flag list", "dotted spelling", {"args": ["--host.x", "1"]}, "args"),
    ("flag list", "config file", {"args": ["--config", "/model/x.yaml"]}, "args"),
    ("flag list", "served name", {"args": ["--served", "x"]}, "args"),
    ("flag list", "unknown flag", {"args": ["--no-such-flag"]}, "args"),
    ("flag list", "bare --", {"args": ["--", "--host"]}, "args"),
    ("flag list", "parameter sets --port", {"parameters": {"p": {"flag": "--po", "where": "doc"}}},
     "parameters.p.flag"),
    ("flag list", "parameter flag not a flag", {"parameters": {"p": {"flag": "port", "where": "doc"}}},
     "parameters.p.flag"),
    ("unknown key", "typo of a required key", {"imagee": SITE["image"], "image": ...}, "imagee"),
    ("unknown key", "extra key", {"privileged": True}, "privileged"),
]


@pytest.mark.parametrize("kind,case,change,field", RECIPE_CASES, ids=[f"{c[0]}-{c[1]}" for c in RECIPE_CASES])
def test_a_site_recipe_field_is_refused_naming_its_file_and_field(tmp_path, kind, case, change, field):
    inv = inventory(tmp_path, [("h1", {**HOST, "recipe": "site-qwen"})], site_recipe(**change))
    errors = refused(["validate", str(inv), "--json"])
    assert any(e["where"].endswith("recipes/site.yaml") and e["message"].startswith(field) for e in errors), errors


def test_an_unknown_key_is_named_with_the_key_it_was_meant_to_be(tmp_path):
    inv = inventory(tmp_path, [("h1", HOST)], site_recipe(imagee=SITE["image"], image=...))
    assert refused(["validate", str(inv), "--json"])[0]["message"] == "imagee: unknown key (did you mean 'image'?)"


def test_a_site_recipe_is_checked_with_the_flag_lists_of_its_version_and_render_claims_only_that(tmp_path):
    def note(recipe_change: dict, recipe="site-qwen") -> str:
        inv = inventory(tmp_path, [("h1", {**HOST, "recipe": recipe})], site_recipe(**recipe_change))
        out = CliRunner().invoke(main, ["render", str(inv), "h1", "--json"])
        assert out.exit_code == 0, out.output
        return next(n for n in json.loads(out.stdout)["notes"] if "flags" in n)

    assert note({}).endswith("vllm flags checked against vllm 0.34.0's recorded flag list (site recipe)")
    # Another version: its flags are not in the recorded list; nothing is claimed.
    assert note({"engine_version": "0.35.1", "args": ["--a-flag-of-0.35"]}).endswith("flags not checked (site recipe)")
    assert note({}, recipe="qwen3-8b-vllm-1gpu").endswith("vllm flags checked with vllm 0.34.0's parser")
    # ...but a managed flag is refused whatever the version.
    inv = inventory(tmp_path, [("h1", {**HOST, "recipe": "site-qwen"})],
                    site_recipe(engine_version="0.35.1", args=["--ho", "0.0.0.0"]))
    assert "reads --ho as --host" in refused(["validate", str(inv), "--json"])[0]["message"]


# (class, case, host data, where, field): the inventory's own doors (host data, services entries).
INVENTORY_CASES = [
    ("managed flag", "sglang --ho", {"engine": "sglang", "model": "tiny-lab", "hardware": "lab-cpu",
                                     "recipe": "tiny-lab-sglang", "extra_args": ["--ho", "0.0.0.0"]}, "extra_args"),
    ("managed flag", "sglang --api-k", {"engine": "sglang", "model": "tiny-lab", "hardware": "lab-cpu",
                                        "recipe": "tiny-lab-sglang", "extra_args": ["--api-k", "k"]}, "extra_args"),
    ("managed flag", "sglang --tp", {"engine": "sglang", "model": "tiny-lab", "hardware": "lab-cpu",
                                     "recipe": "tiny-lab-sglang", "extra_args": ["--tp=2"]}, "extra_args"),
    ("managed flag", "vllm --host=", {"extra_args": ["--host=::"]}, "extra_args"),
    ("managed flag", "vllm -t prefix", {"extra_args": ["-t", "2"]}, "extra_args"),
    ("managed flag", "vllm --api_key", {"extra_args": ["--api_key", "k"]}, "extra_args"),
    ("managed flag", "vllm memory fraction", {"extra_args": ["--gpu-memory-util", "0.99"]}, "extra_args"),
    ("managed flag", "recipe flag by prefix", {"extra_args": ["--max-model", "99999"]}, "extra_args"),
    ("managed flag", "llama.cpp -m", {"engine": "llama.cpp", "model": "tiny-lab", "hardware": "lab-cpu",
                                      "recipe": "tiny-lab-llamacpp", "extra_args": ["-m", "/x"]}, "extra_args"),
    ("managed flag", "in a services entry", {"model": ..., "engine": ..., "services": [
        {"model": "qwen3-8b", "engine": "vllm", "extra_args": ["--ho", "0.0.0.0"]}]}, "extra_args"),
    ("flag value", "recipe parameter read as a flag", {
        "engine": "sglang", "model": "kimi-k3", "hardware": "b300", "gpu_count": 8, "recipe": "kimi-k3-sglang-b300",
        "revision": "a" * 40, "recipe_params": {"mamba_full_memory_ratio": "--host"}}, "recipe_params"),
    ("env", "visible devices", {"env": {"CUDA_VISIBLE_DEVICES": "1"}}, "env"),
    ("env", "rocr visible devices", {"env": {"ROCR_VISIBLE_DEVICES": "1"}}, "env"),
    ("directory", "config_dir in /tmp", {"config_dir": "/tmp/modelfleet"}, "config_dir"),
    ("directory", "model_root /dev/shm", {"model_root": "/dev/shm/models"}, "model_root"),
    ("directory", "config_dir is model_root", {"config_dir": "/srv/m", "model_root": "/srv/m"}, "config_dir"),
    ("directory", "config_dir in model_root", {"config_dir": "/srv/m/etc", "model_root": "/srv/m"}, "config_dir"),
    ("directory", "model_root in config_dir", {"config_dir": "/srv/c", "model_root": "/srv/c/models"},
     "config_dir"),
    ("bound", "768 TiB of RAM", {"host_ram_gib": 768 * 1024}, "host_ram_gib"),
    ("bound", "busbw threshold", {"netcheck_min_busbw_gbps": 1e9}, "netcheck_min_busbw_gbps"),
    ("registry", "bare word", {"image_registry": "myregistry"}, "image_registry"),
    ("registry", "trailing newline", {"image_registry": "reg.example.com\n"}, "image_registry"),
]


@pytest.mark.parametrize("kind,case,change,field", INVENTORY_CASES, ids=[f"{c[0]}-{c[1]}" for c in INVENTORY_CASES])
def test_an_inventory_value_is_refused_naming_host_and_field(tmp_path, kind, case, change, field):
    data = {k: v for k, v in {**HOST, **change}.items() if v is not ...}
    errors = refused(["validate", str(inventory(tmp_path, [("h1", data)])), "--json"])
    assert ("host h1", field) in [(e["where"], e["field"].split(".")[0]) for e in errors], errors


# --data and group_data: the same checks, the error naming where the value came from.
DATA_CASES = [
    ("port=true", "port"), ("gpu_count=two", "gpu_count"), ("served_name=a\nExecStartPre=/bin/sh", "served_name"),
    ('env={"CUDA_VISIBLE_DEVICES": "0"}', "env"), ('extra_args=["--ho", "0.0.0.0"]', "extra_args"),
    ("config_dir=/tmp/x", "config_dir"), ("host_ram_gib=786432", "host_ram_gib"), ("min_driver=r580", "min_driver"),
]


@pytest.mark.parametrize("pair,field", DATA_CASES, ids=[c[1] for c in DATA_CASES])
def test_a_data_override_is_refused_naming_host_field_and_origin(tmp_path, pair, field):
    errors = refused(["validate", str(inventory(tmp_path, [("h1", HOST)])), "--data", pair, "--json"])
    mine = [e for e in errors if (e["where"], e["field"].split(".")[0]) == ("host h1", field)]
    assert mine and all("--data" in e["message"] or field == "min_driver" for e in mine), errors


def test_a_group_data_value_is_refused_naming_its_file(tmp_path):
    inv = inventory(tmp_path, [("h1", HOST)], group_data={"all": "env = {'HIP_VISIBLE_DEVICES': '0'}\n"})
    errors = refused(["validate", str(inv), "--json"])
    assert any(e["field"].startswith("env") and "group_data/all.py" in e["message"] and "gpu_indices" in e["message"]
               for e in errors), errors


def test_a_group_named_all_and_settings_at_module_level_are_named(tmp_path):
    inv = inventory(tmp_path, [("h1", HOST)], tail="all = [('h2', {})]\n")
    assert "group all" in refused(["validate", str(inv), "--json"])[0]["message"]
    inv = inventory(tmp_path, [("h1", HOST)], tail="gpu_stack = False\nBASE = {'x': 1}\n")
    errors = refused(["validate", str(inv), "--json"])
    assert [(e["field"], "module level" in e["message"]) for e in errors] == [("gpu_stack", True)], errors


def test_a_directory_of_modelfleets_own_in_etc_passes(tmp_path):
    inv = inventory(tmp_path, [("h1", {**HOST, "config_dir": "/etc/modelfleet-prod"})])
    assert CliRunner().invoke(main, ["validate", str(inv)]).exit_code == 0


def test_messages_point_the_right_way(tmp_path, monkeypatch):
    # A GGUF: llama.cpp runs no model code; the commit to pin is the GGUF repository's.
    gguf = {"hardware": "h200", "gpu_count": 8, "model": "kimi-k3", "engine": "llama.cpp",
            "recipe": "kimi-k3-llamacpp-h200", "ssh_hostname": "192.0.2.10"}
    result = open_inventory(str(inventory(tmp_path, [("h1", gguf)])))
    assert result.errors == [] and not any("trust_remote_code" in e[2] and "needs" in e[2] for e in result.errors)
    assert any("unsloth/Kimi-K3-GGUF" in w[2] and w[1] == "revision" for w in result.warnings), result.warnings
    # A llama.cpp pool over two hosts.
    pair = [("h1", {**gguf, "pool": "p"}), ("h2", {**gguf, "pool": "p", "ssh_hostname": "192.0.2.11"})]
    errors = open_inventory(str(inventory(tmp_path, pair))).errors
    assert ("pool p", "engine") in [e[:2] for e in errors]
    assert any("llama.cpp has no multi-node mode" in e[2] for e in errors), errors
    # A front door's key of 7 characters: refused for its length.
    monkeypatch.setenv("MF_SHORT_KEY", "abcdefg")
    door = {"hardware": "lab-cpu", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm",
            "router": "r1", "api_key_env": "MF_SHORT_KEY"}
    fleet = [("r1", {**door, "ssh_hostname": "10.0.0.1", "fabric_address": "10.1.0.1"}),
             ("a", {**door, "ssh_hostname": "10.0.0.2", "fabric_address": "10.1.0.2"})]
    errors = open_inventory(str(inventory(tmp_path, fleet))).errors
    assert any("7 characters long" in e[2] for e in errors) and "abcdefg" not in str(errors), errors


def replicas(tmp_path: Path, count: int) -> Path:
    return inventory(tmp_path, [(f"r{i}", {**HOST, "ssh_hostname": f"192.0.2.{10 + i}"}) for i in range(count)])


@pytest.mark.parametrize("options,words", [
    (["--parallel", "0"], "--parallel"), (["--parallel", "-1"], "--parallel"),
    (["--min-healthy", "4"], "more than the 3 endpoint"), (["--parallel", "3"], "takes all 3 endpoints"),
])
def test_upgrade_checks_its_options_before_anything(tmp_path, options, words):
    out = refused(["upgrade", "--dry", str(replicas(tmp_path, 3)), *options])
    assert words in out[0]["message"]


def test_upgrade_takes_an_outage_only_when_told(tmp_path):
    out = CliRunner().invoke(main, ["upgrade", "--dry", str(replicas(tmp_path, 3)), "--parallel", "3",
                                    "--allow-outage"])
    assert out.exit_code == 0
    assert [(b["batch"], b["hosts"]) for b in json.loads(out.stdout)["batches"]] == [(1, ["r0", "r1", "r2"])]
    two = CliRunner().invoke(main, ["upgrade", "--dry", str(replicas(tmp_path, 3)), "--parallel", "2"])
    assert two.exit_code == 0, two.output


def test_a_broken_catalog_file_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    copy = tmp_path / "catalog"
    shutil.copytree(CATALOG_DIR, copy)
    (copy / "recipes" / "qwen3-8b-vllm-1gpu.yaml").write_text(yaml.safe_dump({**SHIPPED, "min_driver": "r580"}))
    monkeypatch.setattr("modelfleet.cli.common.load_catalog", lambda: load_catalog(copy))
    out = refused(["catalog"])[0]["message"]
    assert "qwen3-8b-vllm-1gpu.yaml: min_driver:" in out and len(out.strip().splitlines()) == 1


# Injections the grammar lets through (they are ordinary characters in one value): each stays one argument
# of one line in the unit, one line in the env file.
HOSTILE = "a b;$(id) `id` ${HF_TOKEN} %h 'q' \"d\" \\ x"


def exec_args(unit: str) -> list[str]:
    """ExecStart's arguments as systemd splits them (single quotes with backslash escapes, %% and $$)."""
    line = unit.split("ExecStart=", 1)[1].split("\nExecStop=", 1)[0].replace(" \\\n    ", " ")
    args, i = [], 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        if line[i] == "'":
            out, i = "", i + 1
            while line[i] != "'":
                if line[i] == "\\":
                    i += 1
                out += line[i]
                i += 1
            args.append(out)
            i += 1
        else:
            end = line.find(" ", i)
            end = len(line) if end < 0 else end
            args.append(line[i:end])
            i = end
    return [a.replace("%%", "%").replace("$$", "$") for a in args]


def test_an_accepted_hostile_value_stays_one_argument_and_one_line(tmp_path):
    def files(value: str):
        data = {**HOST, "extra_args": ["--chat-template", value], "env": {"MY_SETTING": value}}
        result = open_inventory(str(inventory(tmp_path, [("h1", data)])))
        assert result.errors == [], result.errors
        svc = result.hosts["h1"].services[0]
        return render.render_unit(svc), render.render_env(svc)

    plain_unit, plain_env = files("x")
    unit, env = files(HOSTILE)
    assert len(unit.splitlines()) == len(plain_unit.splitlines())
    assert len(env.splitlines()) == len(plain_env.splitlines())
    args = exec_args(unit)
    assert args[args.index("--chat-template") + 1] == HOSTILE
    assert len(args) == len(exec_args(plain_unit))
    assert f"MY_SETTING={HOSTILE}" in env.splitlines()


def test_a_value_that_got_past_validation_still_cannot_add_a_line():
    """The renderer's own guard (every template value), for a recipe built around the schema."""
    result = open_inventory(str(Path(__file__).resolve().parents[2] / "inventories" / "h200-local.py"))
    svc = result.hosts[next(iter(result.hosts))].services[0]
    forged = svc.recipe.model_construct(**{**dict(svc.recipe), "source": "x\nExecStartPre=/bin/sh"})
    from dataclasses import replace
    with pytest.raises(ValueError, match="control character"):
        render.render_unit(replace(svc, recipe=forged))


def test_a_name_or_key_with_a_control_character_is_reported_escaped_on_one_line(tmp_path):
    inv = inventory(tmp_path, [("h1\nx", HOST)])
    out = CliRunner().invoke(main, ["validate", str(inv), "--data", "gpu\ncount=1"])
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert "host h1\\nx:" in out.output and "gpu\\ncount: unknown key" in out.output
    assert not any(line in ("x:", "x", "count: unknown key") or line.startswith("count") for line in
                   out.output.splitlines())


COMMIT = "0123456789abcdef0123456789abcdef01234567"
CLEAN = {
    "gb300": [(f"tray-{i}", {"ssh_hostname": f"192.0.2.{20 + i}", "fabric_address": f"10.9.0.{20 + i}",
                             "hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "pool": "k31",
                             "recipe": "kimi-k3.1-pro-vllm-gb300", "revision": COMMIT,
                             "image": "vllm/vllm-openai:v0.34.0"}) for i in range(2)],
    "mi355x": [("m1", {"ssh_hostname": "192.0.2.30", "hardware": "mi355x", "model": "kimi-k3", "engine": "vllm",
                       "recipe": "kimi-k3-vllm-mi355x", "revision": COMMIT, "gpu_count": 8,
                       "image": "vllm/vllm-openai-rocm:v0.34.0"})],
    "llama.cpp": [("w1", {"ssh_hostname": "192.0.2.40", "hardware": "h200", "gpu_count": 2, "model": "kimi-k3",
                          "engine": "llama.cpp", "recipe": "kimi-k3-llamacpp-iq1-m-2gpu-ram", "revision": COMMIT,
                          "image": "ghcr.io/ggml-org/llama.cpp:server-cuda13-b11434"})],
}


@pytest.mark.parametrize("kind", CLEAN)
def test_strict_passes_a_clean_inventory_and_the_recipes_notes_are_information(tmp_path, kind):
    out = CliRunner().invoke(main, ["validate", str(inventory(tmp_path, CLEAN[kind])), "--strict", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["warnings"] == [] and all(i["field"] == "recipe" for i in report["info"])


def test_a_llamacpp_build_tag_names_its_version(tmp_path):
    hosts = [(n, {**d, "image": "ghcr.io/ggml-org/llama.cpp:server-cuda13-b11669"}) for n, d in CLEAN["llama.cpp"]]
    warnings = open_inventory(str(inventory(tmp_path, hosts))).warnings
    assert [w[2] for w in warnings if w[1] == "image"] == [
        "ghcr.io/ggml-org/llama.cpp:server-cuda13-b11669 is llama.cpp b11669, "
        "but recipe kimi-k3-llamacpp-iq1-m-2gpu-ram's flags were checked with b11434"]


@pytest.mark.parametrize("change,message", [
    ({"model": "qwen3-8"}, "model: unknown model 'qwen3-8' (did you mean 'qwen3-8b'?)"),
    ({"hardware": ["h20"]}, "hardware: unknown hardware 'h20' (did you mean 'h200'?)"),
    ({"engine": "vlm"}, "engine: unknown engine 'vlm' (did you mean 'vllm'?)"),
])
def test_a_site_recipe_naming_what_does_not_exist_is_refused_with_the_nearest(tmp_path, change, message):
    inv = inventory(tmp_path, [("h1", HOST)], site_recipe(**change))
    assert refused(["validate", str(inv), "--json"])[0]["message"] == message


def test_two_site_recipes_of_one_id_are_refused(tmp_path):
    inv = inventory(tmp_path, [("h1", HOST)], site_recipe())
    (inv.parent / "recipes" / "zz.yaml").write_text(yaml.safe_dump(site_recipe()))
    assert "already defined" in refused(["validate", str(inv), "--json"])[0]["message"]


@pytest.mark.parametrize("value", ["a\x85b", "a\u2028b", "a\u202eb", "a\x9b31m"])
def test_unicode_line_breaks_and_terminal_controls_are_control_characters(tmp_path, value):
    errors = refused(["validate", str(inventory(tmp_path, [("h1", {**HOST, "env": {"A": value}})])), "--json"])
    assert ("host h1", "env") in [(e["where"], e["field"].split(".")[0]) for e in errors]
    inv = inventory(tmp_path, [("h1", {**HOST, "recipe": "site-qwen"})], site_recipe(notes=value))
    assert refused(["validate", str(inv), "--json"])[0]["message"].startswith("notes")


@pytest.mark.parametrize("args", [["bench", "--num-prompts", "0"], ["bench", "--concurrency", "0,4"],
                                  ["logs", "x", "-n", "-5"], ["tunnel", "x", "--local-port", "70000"]])
def test_cli_option_ranges(tmp_path, args):
    inv = str(inventory(tmp_path, [("h1", HOST)]))
    argv = [args[0], inv, *args[1:]] if args[0] == "bench" else [args[0], inv, *args[2:]]
    out = CliRunner().invoke(main, argv)
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert "Invalid value" in out.output or "must be integers (1 or more)" in out.output, out.output


def test_a_typo_in_a_services_entry_is_named_with_the_nearest_key(tmp_path):
    data = {k: v for k, v in HOST.items() if k not in ("model", "engine")}
    inv = inventory(tmp_path, [("h1", {**data, "services": [{"model": "qwen3-8b", "engine": "vllm", "prot": 8000}]})])
    errors = refused(["validate", str(inv), "--json"])
    assert {"where": "host h1", "field": "prot", "message": "unknown key (did you mean 'port'?)"} in errors, errors


def test_an_endpoint_outside_limit_keeps_the_model_served(tmp_path):
    inv = str(replicas(tmp_path, 3))
    kept = CliRunner().invoke(main, ["upgrade", "--dry", inv, "--parallel", "2", "--limit", "r0", "--limit", "r1"])
    assert kept.exit_code == 0, kept.output
    assert [(b["batch"], b["hosts"]) for b in json.loads(kept.stdout)["batches"]] == [(1, ["r0", "r1"])]
