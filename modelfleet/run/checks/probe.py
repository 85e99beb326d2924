"""Readiness, smoke and tool-call/multi-turn probe of one endpoint, through the openai SDK."""

from __future__ import annotations

import json
import re

import httpx
from openai import APIError, OpenAI

from modelfleet.run.checks import Endpoint, exposure, ready, tls_context

# Tool-call markup that a working parser removes from content (Kimi, Hermes/Qwen, Mistral, Llama styles).
RAW_TOOL_MARKUP = re.compile(r"<\|tool_call|<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>|<\|tool_calls_section")
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def client(ep: Endpoint, timeout_s: float = 120) -> OpenAI:
    # Engines without --api-key accept any bearer; the SDK insists on one.
    context = tls_context(ep)
    http_client = httpx.Client(verify=context, timeout=timeout_s) if context else None
    return OpenAI(base_url=ep.openai_base_url, api_key=ep.api_key or "no-key", timeout=timeout_s, max_retries=0,
                  http_client=http_client)


def smoke(ep: Endpoint, max_tokens: int = 512) -> dict:
    """One short chat completion: content and finish_reason; a budget spent inside reasoning is said as such."""
    try:
        reply = client(ep).chat.completions.create(
            model=ep.model, max_tokens=max_tokens,
            messages=[{"role": "user", "content": "Answer in one short sentence: what is 2 + 2?"}])
    except APIError as error:
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    choice = reply.choices[0]
    message = choice.message.model_dump()
    result = {"ok": bool(message.get("content")), "finish_reason": choice.finish_reason,
              "content": message.get("content"), "reasoning_chars": len(message.get("reasoning_content") or ""),
              "usage": reply.usage.model_dump() if reply.usage else None}
    if not message.get("content") and choice.finish_reason == "length" and message.get("reasoning_content"):
        # The guides warn that reasoning can eat the budget: that is a budget to raise, not a broken server.
        result.update(ok=True, warning=f"max_tokens={max_tokens} ran out inside the reasoning; raise it")
    elif not message.get("content"):
        result["error"] = f"no content (finish_reason={choice.finish_reason})"
    return result


def tool_probe(ep: Endpoint) -> dict:
    """
    Offer a tool, expect a parsed call with no raw markup left; send the result back after the whole assistant
    message (model_dump: reasoning_content and tool_calls kept) and expect a final answer. A well-formed answer
    that simply does not call the tool, or does not end, is the model's doing, not the server's: the result says
    `model_limited` so the two are told apart (the gate still fails: the recipe's probe settings say how to ask).
    """
    api = client(ep)
    messages = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    failures: list[str] = []
    try:
        first = api.chat.completions.create(model=ep.model, messages=messages, tools=[WEATHER_TOOL],
                                            tool_choice=ep.tool_choice, parallel_tool_calls=False,
                                            max_tokens=1024)
    except APIError as error:
        return {"ok": False, "parser_failures": 1, "failures": [f"tool request: {error}"]}
    choice = first.choices[0]
    assistant = choice.message.model_dump(exclude_none=True)
    for field in ("content", "reasoning_content"):
        if RAW_TOOL_MARKUP.search(assistant.get(field) or ""):
            failures.append(f"raw tool-call markup left in {field}")
    calls = assistant.get("tool_calls") or []
    model_limited = None
    if choice.finish_reason != "tool_calls" or not calls:
        failures.append(f"finish_reason={choice.finish_reason} with {len(calls)} tool call(s), expected tool_calls")
        if not calls and not failures[:-1]:
            model_limited = ("the model answered without calling the tool (no markup left behind): its choice, "
                             "not a parser fault" if choice.finish_reason == "stop" else
                             f"the model did not finish (finish_reason={choice.finish_reason}) before calling the tool")
    arguments = None
    for call in calls:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except (KeyError, ValueError):
            failures.append(f"tool call {call.get('id')}: arguments are not JSON")
    result = {"ok": False, "finish_reason": choice.finish_reason, "tool_calls": len(calls), "arguments": arguments,
              "kept_reasoning_content": "reasoning_content" in assistant, "tool_choice": ep.tool_choice}
    if failures:
        return {**result, "parser_failures": 0 if model_limited else len(failures), "failures": failures,
                "model_limited": model_limited}
    messages += [assistant] + [{"role": "tool", "tool_call_id": call["id"],
                                "content": json.dumps({"city": "Paris", "temperature_c": 18, "sky": "clear"})}
                               for call in calls]
    try:
        final = api.chat.completions.create(model=ep.model, messages=messages, tools=[WEATHER_TOOL],
                                            tool_choice=ep.final_tool_choice, max_tokens=1024)
    except APIError as error:
        return {**result, "parser_failures": 0, "failures": [f"multi-turn after the tool result: {error}"]}
    answer = final.choices[0].message.content
    ok = bool(answer) and final.choices[0].finish_reason == "stop"
    limited = None if ok or final.choices[0].finish_reason == "tool_calls" else (
        f"the model did not end its answer (finish_reason={final.choices[0].finish_reason})")
    return {**result, "ok": ok, "parser_failures": 0, "final_finish_reason": final.choices[0].finish_reason,
            "final_answer": answer, "failures": [] if ok else ["no final answer after the tool result"],
            "model_limited": limited}


def verify(ep: Endpoint, ready_timeout_s: float = 60, full: bool = True) -> dict:
    """Readiness, then (full) smoke and the tool probe, and on an endpoint with a key the exposure probe;
    `ok` only when every part run passes."""
    report = ready.report(ep, ready_timeout_s)
    if full:
        report["scope"] = "full"
        if report["readiness"]["ok"]:
            report["smoke"] = smoke(ep)
            report["tool_probe"] = tool_probe(ep)
        report["ok"] = all(report.get(k, {}).get("ok") for k in ("readiness", "smoke", "tool_probe"))
    if ep.api_key and report["readiness"]["ok"]:
        report["exposure"] = exposure.check(ep)
        report["ok"] = report["ok"] and report["exposure"]["ok"]
    return report
