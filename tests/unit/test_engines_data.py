"""What differs between engines is their entry in catalog/engines.yaml: the bench's /metrics series, the boot-log
family the timeline reads. Each entry is held to the lab double's /metrics and to real boot logs, and an entry
without them is refused by name."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import get_args

import pytest
import yaml

from modelfleet.plan.catalog import CATALOG_DIR, BootLog, CatalogError, EngineMetrics, load_catalog
from modelfleet.run import timeline
from modelfleet.run.checks import Endpoint
from modelfleet.run.checks.bench import MetricsScraper, _parse_metrics, engine_metrics
from tests.unit.test_exposure import DOUBLE

ENGINES = load_catalog().engines
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine-logs"


def _catalog_without(tmp_path: Path, engine: str, field: str) -> Path:
    root = tmp_path / "catalog"
    shutil.copytree(CATALOG_DIR, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    data = yaml.safe_load((root / "engines.yaml").read_text())
    del data[engine][field]
    (root / "engines.yaml").write_text(yaml.safe_dump(data))
    return root


@pytest.mark.parametrize("field", ["metrics", "boot_log"])
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_an_entry_must_say_what_it_has(tmp_path, engine, field):
    """No engine inherits another's metrics or log format: leaving the field out is an error naming both."""
    with pytest.raises(CatalogError, match=rf"engine {engine}: {field}: Field required"):
        load_catalog.__wrapped__(_catalog_without(tmp_path, engine, field))


def test_hits_need_queries():
    with pytest.raises(ValueError, match="go together"):
        EngineMetrics(prefix_hits="x_total")
    with pytest.raises(ValueError, match="not both"):
        EngineMetrics(prefix_hits="x_total", prefix_queries="y_total", prefix_hit_rate="z")


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_metric_names_are_the_engines_own(engine):
    """Every series an entry names is on the lab double's /metrics for that engine (the double's names are the
    engines' documented ones), and the bench's summary reads each of them."""
    exposed = _parse_metrics(DOUBLE.metrics_text(SimpleNamespace(engine=engine, served="m")))
    names = ENGINES[engine].metrics
    declared = {k: v for k, v in names.model_dump().items() if v}
    assert set(declared.values()) <= set(exposed)
    scraper = MetricsScraper(Endpoint(name="h/p", base_url="http://127.0.0.1:1", model="m", engine=engine))
    scraper.samples = [exposed, exposed]
    summary = scraper.summary()
    if not declared:  # `metrics: {}`: said outright, never another engine's names
        assert summary == {"not_measured": f"engine {engine}: its catalog entry names no /metrics series"}
        return
    assert ("queue_max" in summary) == bool(names.queue) and ("kv_max" in summary) == bool(names.kv)
    assert ("prefix_cache_hit_rate" in summary) == bool(names.prefix_hits or names.prefix_hit_rate)


def test_an_engine_outside_the_catalog_is_not_measured():
    assert engine_metrics("remote") is None
    scraper = MetricsScraper(Endpoint(name="remote", base_url="http://127.0.0.1:1", model="m", engine="remote"))
    scraper.start()
    scraper.done.set()
    scraper.join(5)
    assert scraper.samples == []  # nothing is asked of it
    assert scraper.summary() == {"not_measured": "engine remote: not an engine of the catalog"}


def test_every_boot_log_family_has_a_parser():
    assert set(get_args(BootLog)) == set(timeline.PARSERS)


@pytest.mark.parametrize("engine", sorted(e for e in ENGINES if ENGINES[e].boot_log))
def test_boot_log_family_reads_the_engines_real_logs(engine):
    """Each engine's recorded boot logs (tests/fixtures/engine-logs/<engine>-*.txt) give events under its family."""
    logs = sorted(LOGS.glob(f"{engine}-*.txt"))
    assert logs
    for path in logs:
        lines = path.read_text().split("# ---\n", 1)[1].splitlines()
        assert timeline.parse_boot(engine, lines)["events"], path.name


def test_an_engine_whose_log_is_not_read_says_so(monkeypatch):
    silent = {**ENGINES, "llama.cpp": ENGINES["llama.cpp"].model_copy(update={"boot_log": None})}
    monkeypatch.setattr(timeline, "load_catalog", lambda: SimpleNamespace(engines=silent))
    assert timeline.parse_boot("llama.cpp", ["main: server is listening on http://127.0.0.1:8080"]) is None


def test_llama_servers_boot_on_the_h200_in_its_own_time():
    """The recorded llama-server boot: the model's load, its context, loaded, listening, at llama.cpp's own
    seconds; an older build's lines without stamps still name the events."""
    path = LOGS / "llama.cpp-h200-b11434.txt"
    boot = timeline.parse_boot("llama.cpp", path.read_text().split("# ---\n", 1)[1].splitlines())
    assert [(e["event"], e["at"]) for e in boot["events"]] == [
        ("weights_begin", 0.0), ("context_initialized", 0.466), ("model_loaded", 0.474),
        ("api_server_started", 0.474)]
    assert boot["events"][0]["path"] == "/model/tiny-moe.gguf" and boot["events"][-1]["url"] == "http://127.0.0.1:8080"
    old = timeline.parse_boot("llama.cpp", ["main: model loaded", "main: server is listening on http://0.0.0.0:8080"])
    assert [e["event"] for e in old["events"]] == ["model_loaded", "api_server_started"]
    assert all("at" not in e for e in old["events"])


def test_an_unknown_engine_has_no_boot_log_to_guess():
    with pytest.raises(CatalogError, match="no engine 'trtllm'"):
        timeline.parse_boot("trtllm", ["[TensorRT-LLM] ready"])


def test_expert_offload_flags_are_the_real_llama_servers_and_only_an_engine_with_them_offloads():
    """The flags the planner reads as "experts in RAM" are flags the lab's real llama-server lists in its
    --help; a recipe of an engine without `expert_offload` keeps every weight on the GPUs, whatever its args."""
    import json

    from modelfleet.plan.planner import expert_offload

    listed = json.loads((Path(__file__).resolve().parents[2] / "modelfleet/plan/catalog/engine_flags.json").read_text())
    real = set(listed["llama.cpp"]["flags"]) | set(listed["llama.cpp"]["aliases"])
    offload = ENGINES["llama.cpp"].expert_offload
    assert set(offload.all + offload.layers + offload.fit) <= real
    assert [name for name, e in ENGINES.items() if e.expert_offload] == ["llama.cpp"]
    recipes = load_catalog().recipes
    ram = recipes["kimi-k3-llamacpp-iq1-m-1gpu-ram"]
    assert expert_offload(ram) == ("all", 0)
    vllm = next(r for r in recipes.values() if r.engine == "vllm")
    assert expert_offload(vllm.model_copy(update={"args": [*vllm.args, "--cpu-moe"]})) is None
