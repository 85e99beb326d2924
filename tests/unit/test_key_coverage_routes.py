"""What vLLM's key protects, held to the pinned vLLM's own route table (lab/engine_parsers/check.py routes reads
its source, in the engine parsers' environment): key_coverage.yaml's version is that vLLM's, its guarded prefixes
are the key middleware's, and every route the server registers outside them is listed as open, no more, no less.
`make test` may not skip this (MODELFLEET_REQUIRE_ENGINE_PARSERS)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import lab.engine_parsers as engine_parsers
from modelfleet.plan.exposure import key_coverage

# The routes the vLLM 0.34 security page lists as open besides the older ones (its /fault_tolerance/* are
# /v1/fault_tolerance/* in the code: under the key).
DOCUMENTED_034 = ("/checkpoint/prepare", "/checkpoint/restore", "/checkpoint/status", "/kv_event_sources", "/metrics",
                  "/invocations")


def test_the_catalog_lists_every_route_the_034_documentation_names_open():
    vllm = key_coverage()["vllm"]
    assert [r for r in DOCUMENTED_034 if r not in vllm.open_routes] == []
    assert set(vllm.open_inference_routes) <= set(vllm.open_routes)
    assert not any(r.startswith(tuple(vllm.guarded_prefixes)) for r in vllm.open_routes)


@pytest.mark.slow
def test_vllms_open_routes_are_its_own_route_table_outside_the_prefixes_its_key_guards():
    if not engine_parsers.built():
        reason = f"the engine parsers' environment is not built ({engine_parsers.venv_dir()}): make engine-parsers"
        if os.environ.get("MODELFLEET_REQUIRE_ENGINE_PARSERS"):
            raise RuntimeError(reason)
        pytest.skip(reason)
    proc = subprocess.run([str(engine_parsers.python()), str(engine_parsers.CHECK), "routes"], text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table, vllm = json.loads(proc.stdout), key_coverage()["vllm"]
    assert table["version"] == vllm.version
    assert table["guarded_prefixes"] == vllm.guarded_prefixes
    assert "/v1/chat/completions" in table["routes"] and "/invocations" in table["routes"]  # the scan found routes
    outside = sorted(r for r in table["routes"] if not r.startswith(tuple(table["guarded_prefixes"])))
    assert outside == sorted(vllm.open_routes), {"unlisted": sorted(set(outside) - set(vllm.open_routes)),
                                                 "gone": sorted(set(vllm.open_routes) - set(outside))}
