"""Engine caches on the lab, through serve.py over SSH: the engine double plays vLLM and keeps its torch.compile
cache under the mounted roots as vLLM does. A first start compiles; a restart loads from the cache; a second
replica with the same key joining the run gets the first one's cache from it (indexed there, every file checked)
before its engine starts, so its first start loads too. Each start's word comes from the engine's own log lines
in the boot timeline (reports/timeline/<pool>.json)."""

import json
import os

import pytest

from lab import scenario, ssh
from modelfleet import REPO_ROOT
from modelfleet.base.commands import run_pyinfra

pytestmark = pytest.mark.lab


def serve(names: list[str], tmp_path, **fields) -> str:
    scenario.write(only=names, engine="vllm", **fields)
    env = {**os.environ, "MODELFLEET_REPORTS": str(tmp_path / "reports")}
    run = run_pyinfra("inventories/lab.py", "deploys/serve.py", cwd=REPO_ROOT, env=env, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    return run.stdout + run.stderr


def compile_cache(tmp_path, spec: dict) -> str | None:
    report = json.loads((tmp_path / "reports" / "timeline" / f"tiny-{spec['name']}.json").read_text())
    return report["hosts"][spec["name"]]["engine_boot"]["compile_cache"]


def cache_files(spec: dict) -> dict[str, str]:
    """{path under the key directory: sha256} of the host's vLLM cache (one key: one recipe, one image)."""
    root = f"{spec['model_root']}/.cache/vllm"
    shown = ssh(spec, f"cd {root} && for k in $(ls | grep -Ex '[0-9a-f]{{16}}'); do "
                      f"(cd $k && find . -type f ! -name '.modelfleet-*' -exec sha256sum {{}} +) "
                      f"| sed \"s|  ./|  $k/|\"; done")
    assert shown.returncode == 0, shown.stderr
    return {line.split("  ", 1)[1]: line.split()[0] for line in shown.stdout.splitlines()}


def test_a_restart_loads_its_cache_and_a_joining_replica_gets_a_peers_copy(lab_hosts, tmp_path):
    first, second = lab_hosts[0], lab_hosts[1]
    for spec in (first, second):
        assert ssh(spec, f"rm -rf {spec['model_root']}/.cache/vllm").returncode == 0

    serve([first["name"]], tmp_path)
    assert compile_cache(tmp_path, first) == "cold"
    warm = cache_files(first)
    assert any("/torch_compile_cache/" in p for p in warm) and any("/triton/" in p for p in warm), warm

    # A changed environment value restarts the engine on the same key: it loads what it compiled.
    serve([first["name"]], tmp_path, engine_env={"LAB_NOTE": "restart"})
    assert compile_cache(tmp_path, first) == "warm"

    # The second replica (same recipe, image and GPU: the same key) joins: the first is indexed and serves it.
    out = serve([first["name"], second["name"]], tmp_path,
                engine_env={"LAB_NOTE": "restart"})
    key = next(iter(warm)).split("/", 1)[0]
    assert f"Index engine cache {key}" in out and f"Copy engine cache {key} from a peer" in out
    assert cache_files(second) == cache_files(first) == warm
    manifest = ssh(second, f"cat {second['model_root']}/.cache/vllm/{key}/.modelfleet-manifest.json")
    assert sorted(json.loads(manifest.stdout)["files"]) == sorted(p.split("/", 1)[1] for p in warm)
    assert compile_cache(tmp_path, second) == "warm"

    # Converged: nothing is indexed or copied again.
    again = serve([first["name"], second["name"]], tmp_path,
                  engine_env={"LAB_NOTE": "restart"})
    results = operation_results(again)
    ours = [op for op in results if op.startswith(("Index engine cache", "Copy engine cache"))]
    assert ours and all(set(results[op].values()) == {"No changes"} for op in ours), {op: results[op] for op in ours}


def operation_results(output: str) -> dict[str, dict[str, str]]:
    """{operation name (without its deploy's): {host: its result line}} from pyinfra's output."""
    results: dict[str, dict[str, str]] = {}
    for part in output.split("--> Starting operation: ")[1:]:
        name, *lines = part.splitlines()
        for line in lines:
            line = line.strip()
            if line.startswith("[") and "] " in line:
                host, _, said = line[1:].partition("] ")
                results.setdefault(name.split(" | ", 1)[-1].strip(), {})[host] = said.strip()
    return results
