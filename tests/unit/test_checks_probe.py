"""Readiness, smoke and the tool-call/multi-turn probe (checks/probe.py) through the openai SDK, against the lab's
engine double on loopback: a reasoning engine (vLLM, SGLang) and one without reasoning (llama.cpp), a double
that leaves raw tool-call markup in content, and answers that are the model's doing rather than a parser's."""

from __future__ import annotations

import pytest

from modelfleet.run.checks import Endpoint, probe
from tests.helpers.engine_on_loopback import engine_on_loopback

KEY = "k-probe-test"


def endpoint(url: str, engine: str, key: str | None = KEY, **settings) -> Endpoint:
    return Endpoint(name="h/p", base_url=url, model="tiny-lab", engine=engine, api_key=key, **settings)


@pytest.mark.parametrize("engine, reasoning", [("sglang", True), ("llama.cpp", False)])
def test_a_working_engine_passes_every_part(monkeypatch, engine, reasoning):
    with engine_on_loopback(monkeypatch, engine, key=KEY) as url:
        report = probe.verify(endpoint(url, engine), ready_timeout_s=2)
    assert report["ok"] and report["scope"] == "full", report
    assert report["smoke"]["finish_reason"] == "stop" and "Hello from the modelfleet lab" in report["smoke"]["content"]
    tools = report["tool_probe"]
    assert (tools["finish_reason"], tools["tool_calls"], tools["arguments"]) == ("tool_calls", 1, {"city": "Paris"})
    assert tools["kept_reasoning_content"] is reasoning  # sent back whole: the double refuses a turn without it
    assert tools["final_finish_reason"] == "stop" and "Paris" in tools["final_answer"]
    assert report["exposure"]["ok"]  # a keyed endpoint is also asked without its key


def test_raw_tool_call_markup_in_content_is_a_parser_failure(monkeypatch):
    with engine_on_loopback(monkeypatch, "vllm", malformed_tool_calls=1) as url:
        result = probe.tool_probe(endpoint(url, "vllm", key=None))
    assert not result["ok"] and result["model_limited"] is None
    assert result["failures"] == ["raw tool-call markup left in content",
                                  "finish_reason=stop with 0 tool call(s), expected tool_calls"]
    assert result["parser_failures"] == 2


def test_an_answer_without_the_tool_is_the_models_choice_not_a_parser_fault(monkeypatch):
    # tool_choice "none" (a recipe's probe setting) makes the double answer in plain words, as a model may
    with engine_on_loopback(monkeypatch, "vllm") as url:
        result = probe.tool_probe(endpoint(url, "vllm", key=None, tool_choice="none"))
    assert not result["ok"] and result["parser_failures"] == 0 and result["tool_choice"] == "none"
    assert result["model_limited"].startswith("the model answered without calling the tool")


def test_a_budget_spent_inside_reasoning_is_a_warning_not_a_failure(monkeypatch):
    with engine_on_loopback(monkeypatch, "sglang") as url:
        ep = endpoint(url, "sglang", key=None)
        short, whole = probe.smoke(ep, max_tokens=3), probe.smoke(ep)
    assert short["ok"] and short["finish_reason"] == "length" and short["content"] is None
    assert short["warning"] == "max_tokens=3 ran out inside the reasoning; raise it"
    assert short["reasoning_chars"] > 0
    assert whole["ok"] and "warning" not in whole


def test_a_model_the_engine_does_not_serve_fails_smoke_with_the_engines_error(monkeypatch):
    with engine_on_loopback(monkeypatch, "vllm", served="other-model") as url:
        result = probe.smoke(endpoint(url, "vllm", key=None))
    assert not result["ok"] and result["error"].startswith("NotFoundError")
    assert "tiny-lab" in result["error"]


def test_the_wrong_key_fails_smoke_and_the_tool_probe(monkeypatch):
    with engine_on_loopback(monkeypatch, "llama.cpp", key=KEY) as url:
        ep = endpoint(url, "llama.cpp", key="not-the-key")
        smoke, tools = probe.smoke(ep), probe.tool_probe(ep)
    assert smoke["error"].startswith("AuthenticationError")
    assert not tools["ok"] and tools["failures"][0].startswith("tool request:")


def test_an_endpoint_that_is_not_ready_gets_no_smoke_or_probe(monkeypatch):
    with engine_on_loopback(monkeypatch, "vllm", never_ready=1) as url:
        report = probe.verify(endpoint(url, "vllm"), ready_timeout_s=0)
    assert not report["ok"] and not report["readiness"]["ok"]
    assert not {"smoke", "tool_probe", "exposure"} & set(report)


def test_readiness_only_asks_exposure_on_keyed_endpoints_only(monkeypatch):
    with engine_on_loopback(monkeypatch, "llama.cpp", key=KEY) as keyed_url:
        keyed = probe.verify(endpoint(keyed_url, "llama.cpp"), ready_timeout_s=5, full=False)
    assert keyed["ok"] and keyed["exposure"]["ok"] and "smoke" not in keyed
    with engine_on_loopback(monkeypatch, "llama.cpp") as open_url:
        assert "exposure" not in probe.verify(endpoint(open_url, "llama.cpp", key=None), ready_timeout_s=5, full=False)


def test_an_engine_that_answers_without_its_key_fails_verify(monkeypatch):
    with engine_on_loopback(monkeypatch, "sglang") as url:  # started without a key: every route answers
        report = probe.verify(endpoint(url, "sglang", key="k-the-site-set"), ready_timeout_s=2)
    assert report["smoke"]["ok"] and report["tool_probe"]["ok"]
    assert not report["exposure"]["ok"] and not report["ok"]
