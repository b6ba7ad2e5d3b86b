"""Every golden wire case (tests/fixtures/{openai,anthropic}/wire) through the official
SDK of its client format: the mock is scripted as the fixture's upstream, the SDK parses
what Sluice sends, and nothing Sluice emits makes an SDK raise — except an error, which
must raise that SDK's own error class. Streams go through each SDK's accumulating helper
where it has one (the Anthropic SDK checks block order and indexes as it goes), and the
parallel tool calls and refusals are checked field by field.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anthropic
import openai
import pytest

from conftest import ANTHROPIC_UPSTREAM_KEY, UPSTREAM_KEY, http_json

WIRE = Path(__file__).resolve().parents[1] / "fixtures"
MODEL_OF = {"openai": ("gpt-4o-mini", UPSTREAM_KEY), "anthropic": ("claude-mock", ANTHROPIC_UPSTREAM_KEY)}


def cases():
    out = []
    for upstream in ("openai", "anthropic"):
        for f in sorted((WIRE / upstream / "wire").glob("*.json")):
            if f.name.endswith(".expected.json"):
                continue
            out.append(pytest.param(upstream, f, id=f"{upstream}/{f.stem}"))
    return out


def sdk(kind, sluice):
    if kind == "openai":
        return openai.OpenAI(base_url=sluice.base_url, api_key=sluice.token, max_retries=0, timeout=10.0)
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{sluice.gw_port}", api_key=sluice.token, max_retries=0, timeout=10.0)


# The upstream's own faults that rest its key when they end a stream, as a 529 or a 429
# before it would (the first rest: one second).
RESTING_FAULTS = {"overloaded_error", "rate_limit_error"}


def rests_the_key(case):
    """Whether the case's upstream stream ends on a fault that rests its key: the next case
    would find the key cooling down and be answered 503."""
    for event in case["upstream"].get("events") or []:
        data = event[1] if isinstance(event, list) and len(event) > 1 else None
        if isinstance(data, dict) and (data.get("error") or {}).get("type") in RESTING_FAULTS:
            return True
    return False


def run(sluice, upstream, case):
    """The fixture's request through its client's SDK: the parsed answer, or the raised
    error. A case whose stream rests the key waits the rest out before the next case."""
    try:
        return send(sluice, upstream, case)
    finally:
        if rests_the_key(case):
            time.sleep(1.5)


def send(sluice, upstream, case):
    model, key = MODEL_OF[upstream]
    # A case the gateway refuses leaves its script queued: start each from a clean mock.
    http_json("POST", f"{sluice.mock_url}/_mock/reset")
    http_json("POST", f"{sluice.mock_url}/_mock/script", {"key": key, "responses": [case["upstream"]]})
    req = dict(case["request"], model=model)
    headers = case.get("headers") or {}
    client = sdk(case["client"], sluice)
    stream = req.pop("stream", False)
    if case["client"] == "openai":
        if not stream:
            return client.chat.completions.create(**req, extra_headers=headers)
        return list(client.chat.completions.create(**req, stream=True, extra_headers=headers))
    if not stream:
        return client.messages.create(**req, extra_headers=headers)
    with client.messages.stream(**req, extra_headers=headers) as s:
        for _ in s:
            pass
        return s.get_final_message()


@pytest.mark.parametrize("upstream,path", cases())
def test_every_wire_case_parses_in_its_sdk(sluice, upstream, path):
    case = json.loads(path.read_text())
    want = json.loads(path.with_name(path.stem + ".expected.json").read_text())
    errors = openai if case["client"] == "openai" else anthropic
    response = want["response"]
    streamed_error = isinstance(response, list) and any(
        (e[0] == "error") or (isinstance(e[1], dict) and "error" in e[1]) for e in response
    )
    if want["status"] >= 400:
        with pytest.raises(errors.APIStatusError) as err:
            run(sluice, upstream, case)
        assert err.value.status_code == want["status"]
        assert err.value.message
    elif streamed_error:
        with pytest.raises(errors.APIError) as err:
            run(sluice, upstream, case)
        message = response[-1][1]["error"]["message"]
        assert message in str(err.value)
    else:
        assert run(sluice, upstream, case) is not None


def test_parallel_tool_calls_reach_the_openai_sdk_whole(sluice):
    """Anthropic upstream, two `tool_use` blocks streamed: the OpenAI SDK's stream helper
    assembles two tool calls, each with its id, name and complete arguments."""
    case = json.loads((WIRE / "anthropic/wire/parallel_tool_use_stream.json").read_text())
    model, key = MODEL_OF["anthropic"]
    http_json("POST", f"{sluice.mock_url}/_mock/reset")
    http_json("POST", f"{sluice.mock_url}/_mock/script", {"key": key, "responses": [case["upstream"]]})
    req = dict(case["request"], model=model)
    req.pop("stream")
    with sdk("openai", sluice).chat.completions.stream(**req) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    upstream_blocks = [e[1]["content_block"] for e in case["upstream"]["events"]
                       if e[0] == "content_block_start" and e[1]["content_block"]["type"] == "tool_use"]
    assert [(c[0], c[1]) for c in calls] == [(b["id"], b["name"]) for b in upstream_blocks]
    assert all(isinstance(c[2], dict) and c[2] for c in calls), calls


def test_parallel_tool_calls_reach_the_anthropic_sdk_whole(sluice):
    """OpenAI-format upstream, parallel tool calls side by side: the Anthropic SDK's
    stream helper assembles one `tool_use` block per call, inputs parsed."""
    case = json.loads((WIRE / "openai/wire/parallel_tool_calls_stream.json").read_text())
    final = run(sluice, "openai", case)
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    ids = []
    for e in case["upstream"]["events"]:
        if isinstance(e, dict):
            for c in e.get("choices", [{}])[0].get("delta", {}).get("tool_calls", []) if e.get("choices") else []:
                if c.get("id"):
                    ids.append(c["id"])
    assert [u.id for u in uses] == ids
    assert all(isinstance(u.input, dict) and u.input for u in uses), uses


def test_a_refusal_reaches_each_sdk_as_its_own_stop(sluice):
    """Anthropic `stop_reason: refusal` streamed to the OpenAI SDK ends with
    `finish_reason: content_filter`; OpenAI's `content_filter` streamed to the Anthropic SDK
    ends with `stop_reason: refusal` — and neither SDK raises on the way."""
    case = json.loads((WIRE / "anthropic/wire/refusal_stream.json").read_text())
    chunks = run(sluice, "anthropic", case)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["content_filter"]
    case = json.loads((WIRE / "openai/wire/content_filter_stream.json").read_text())
    final = run(sluice, "openai", case)
    assert final.stop_reason == "refusal"
