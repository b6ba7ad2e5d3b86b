"""An Azure OpenAI deployment behind Sluice, through the official OpenAI and Anthropic SDKs.

`azure-mini` routes to the mock's Azure side (`provider = "azure_openai"`, the deployment
path with `api-version`, the `api-key` header). Each SDK gets plain and streamed answers,
a tool round trip, and Azure's content filter as its own `BadRequestError`.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from conftest import AZURE_UPSTREAM_KEY, MOCK_COMPLETION_TOKENS, MOCK_PROMPT_TOKENS, MOCK_TEXT, http_json

MODEL = "azure-mini"
TOOL_ARGS = {"vin": "WVWZZZ1JZXW000001"}
SCHEMA = {"type": "object", "properties": {"vin": {"type": "string"}}, "required": ["vin"]}


def openai_client(sluice):
    return openai.OpenAI(base_url=sluice.base_url, api_key=sluice.token, max_retries=0, timeout=10.0)


def anthropic_client(sluice):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{sluice.gw_port}", api_key=sluice.token,
                               max_retries=0, timeout=10.0)


def azure_stats(sluice):
    return sluice.mock_stats()["keys"][AZURE_UPSTREAM_KEY]


def script(sluice, *responses):
    http_json("POST", f"{sluice.mock_url}/_mock/script", {"key": AZURE_UPSTREAM_KEY, "responses": list(responses)})


def test_openai_sdk_plain_and_streamed(sluice):
    client = openai_client(sluice)
    r = client.chat.completions.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == MOCK_TEXT
    assert r.usage.prompt_tokens == MOCK_PROMPT_TOKENS and r.usage.completion_tokens == MOCK_COMPLETION_TOKENS
    stats = azure_stats(sluice)
    assert stats["last_paths"][-1] == "/openai/deployments/sdk-deployment/chat/completions"
    assert stats["last_headers"][-1]["api-key"] == AZURE_UPSTREAM_KEY
    stream = client.chat.completions.create(model=MODEL, max_tokens=100, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "hi"}])
    text, usage = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
        usage = chunk.usage or usage
    assert text == MOCK_TEXT
    assert usage is not None and usage.completion_tokens == MOCK_COMPLETION_TOKENS


def test_anthropic_sdk_plain_and_streamed(sluice):
    client = anthropic_client(sluice)
    r = client.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    assert "".join(b.text for b in r.content if b.type == "text") == MOCK_TEXT
    assert r.usage.output_tokens == MOCK_COMPLETION_TOKENS
    with client.messages.stream(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == MOCK_TEXT
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == MOCK_COMPLETION_TOKENS


def test_tool_round_trips_through_both_sdks(sluice):
    user = {"role": "user", "content": "Which car is WVWZZZ1JZXW000001?"}
    oa = openai_client(sluice)
    tools = [{"type": "function", "function": {"name": "lookup_vin", "description": "Find a vehicle", "parameters": SCHEMA}}]
    r1 = oa.chat.completions.create(model=MODEL, max_tokens=100, messages=[user], tools=tools)
    call = r1.choices[0].message.tool_calls[0]
    assert call.function.name == "lookup_vin" and json.loads(call.function.arguments) == TOOL_ARGS
    follow = [user, r1.choices[0].message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": "Golf, 2019"}]
    r2 = oa.chat.completions.create(model=MODEL, max_tokens=100, messages=follow, tools=tools)
    assert r2.choices[0].message.content == MOCK_TEXT

    an = anthropic_client(sluice)
    atools = [{"name": "lookup_vin", "description": "Find a vehicle", "input_schema": SCHEMA}]
    with an.messages.stream(model=MODEL, max_tokens=100, messages=[user], tools=atools) as s:
        m1 = s.get_final_message()
    assert m1.stop_reason == "tool_use"
    use = next(b for b in m1.content if b.type == "tool_use")
    assert use.name == "lookup_vin" and use.input == TOOL_ARGS
    sent = azure_stats(sluice)["last_bodies"][-1]
    assert sent["tools"][0]["function"]["parameters"] == SCHEMA


def test_the_content_filter_is_each_sdks_bad_request(sluice):
    script(sluice, {"content_filter": "prompt"}, {"content_filter": "prompt"})
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(sluice).chat.completions.create(model=MODEL, max_tokens=100,
                                                       messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "content_filter"
    assert "content management policy" in err.value.message
    with pytest.raises(anthropic.BadRequestError) as aerr:
        anthropic_client(sluice).messages.create(model=MODEL, max_tokens=100,
                                                 messages=[{"role": "user", "content": "hi"}])
    assert aerr.value.status_code == 400
    assert "content management policy" in str(aerr.value)
