"""engine_flags: a token is read as the engine's own parser reads it (prefixes, aliases, `=`, vLLM's `_` and
dotted keys, llama-server's whole names), from the recorded flag lists the package ships."""

from __future__ import annotations

import pytest

from modelfleet.plan import engine_flags
from modelfleet.plan.catalog import load_catalog

ENGINES = load_catalog().engines


def table(name):
    return engine_flags.table(name, ENGINES[name].flag_parser)


@pytest.mark.parametrize("engine,token,option", [
    ("sglang", "--ho", "--host"), ("sglang", "--api-k", "--api-key"), ("sglang", "--ho=0.0.0.0", "--host"),
    ("sglang", "--tp", "--tp-size"), ("sglang", "--served", "--served-model-name"),
    ("vllm", "--ho", "--host"), ("vllm", "--api_key", "--api-key"), ("vllm", "-tp", "--tensor-parallel-size"),
    ("vllm", "--port.x", "--port"), ("vllm", "--host=::", "--host"), ("vllm", "--conf", "--config"),
    ("llama.cpp", "--host=0.0.0.0", "--host"), ("llama.cpp", "-a", "--alias"),
])
def test_a_managed_flag_is_reached_by_every_spelling_the_parser_accepts(engine, token, option):
    flags = table(engine)
    assert option in flags.reach(token)
    assert option in engine_flags.managed(ENGINES[engine], flags)
    assert engine_flags.problems([token, "x"], flags, engine_flags.managed(ENGINES[engine], flags), False)


def test_llama_server_matches_whole_names_only_and_unknown_flags_are_named():
    flags = table("llama.cpp")
    assert flags.reach("--ho") == set() and flags.version == "b11669"
    assert engine_flags.problems(["--no-such-flag"], flags, {}, check_unknown=True) == [
        "--no-such-flag is not a flag of llama.cpp b11669's parser (recorded in catalog/engine_flags.json)"]
    assert engine_flags.problems(["--ctx-size", "-1", "--jinja"], flags, {}, check_unknown=True) == []


def test_a_bare_double_dash_is_refused():
    assert engine_flags.problems(["--"], table("vllm"), {}, False)


def test_the_package_reads_its_own_copy_of_the_flag_lists():
    assert engine_flags.FLAGS_FILE.parent.name == "catalog" and engine_flags.FLAGS_FILE.is_file()
