"""The official OpenAI and Anthropic SDKs through Sluice to a `gemini` upstream (the mock's
Gemini API side): a plain answer, a stream, a tool round trip, and a field Gemini cannot
express raised as the SDK's own 400.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from conftest import GEMINI_UPSTREAM_KEY, MOCK_TEXT

TOOL_ARGS = {"vin": "WVWZZZ1JZXW000001"}


def sdk(kind, sluice):
    if kind == "openai":
        return openai.OpenAI(base_url=sluice.base_url, api_key=sluice.token, max_retries=0, timeout=10.0)
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{sluice.gw_port}", api_key=sluice.token, max_retries=0, timeout=10.0)


def last(sluice):
    k = sluice.mock_stats()["keys"][GEMINI_UPSTREAM_KEY]
    return k["last_paths"][-1], k["last_bodies"][-1]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_plain_and_streamed_answers_from_gemini(sluice, kind):
    client = sdk(kind, sluice)
    msgs = [{"role": "user", "content": "hello"}]
    if kind == "openai":
        r = client.chat.completions.create(model="gemini-mock", messages=msgs, max_tokens=100)
        assert r.choices[0].message.content == MOCK_TEXT
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (12, 24)
        stream = client.chat.completions.create(model="gemini-mock", messages=msgs, max_tokens=100, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    else:
        r = client.messages.create(model="gemini-mock", messages=msgs, max_tokens=100)
        assert "".join(b.text for b in r.content if b.type == "text") == MOCK_TEXT
        assert (r.usage.input_tokens, r.usage.output_tokens) == (12, 24)
        with client.messages.stream(model="gemini-mock", messages=msgs, max_tokens=100) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert final.stop_reason == "end_turn" and final.usage.output_tokens == 24
    assert text == MOCK_TEXT
    path, body = last(sluice)
    assert path == "/v1beta/models/gemini-mock-upstream:streamGenerateContent"
    assert body["generationConfig"]["maxOutputTokens"] == 100


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_tool_round_trip_through_gemini(sluice, kind):
    client = sdk(kind, sluice)
    schema = {"type": "object", "properties": {"vin": {"type": "string"}}, "required": ["vin"]}
    user = {"role": "user", "content": "Which car is WVWZZZ1JZXW000001?"}
    if kind == "openai":
        tools = [{"type": "function", "function": {"name": "lookup_vin", "description": "Find a vehicle", "parameters": schema}}]
        r1 = client.chat.completions.create(model="gemini-mock", messages=[user], tools=tools, max_tokens=100)
        assert r1.choices[0].finish_reason == "tool_calls"
        call = r1.choices[0].message.tool_calls[0]
        assert call.function.name == "lookup_vin" and json.loads(call.function.arguments) == TOOL_ARGS
        follow = [user, r1.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": "Golf, 2019"}]
        r2 = client.chat.completions.create(model="gemini-mock", messages=follow, tools=tools, max_tokens=100)
        assert r2.choices[0].message.content == MOCK_TEXT
    else:
        tools = [{"name": "lookup_vin", "description": "Find a vehicle", "input_schema": schema}]
        r1 = client.messages.create(model="gemini-mock", messages=[user], tools=tools, max_tokens=100)
        assert r1.stop_reason == "tool_use"
        use = next(b for b in r1.content if b.type == "tool_use")
        assert use.name == "lookup_vin" and use.input == TOOL_ARGS
        follow = [user, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Golf, 2019"}]}]
        r2 = client.messages.create(model="gemini-mock", messages=follow, tools=tools, max_tokens=100)
        assert "".join(b.text for b in r2.content if b.type == "text") == MOCK_TEXT
    _, body = last(sluice)
    response = body["contents"][-1]["parts"][0]["functionResponse"]
    assert response == {"name": "lookup_vin", "response": {"output": "Golf, 2019"}}
    assert body["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"] == schema


def test_a_field_gemini_cannot_express_is_the_sdks_bad_request(sluice):
    client = sdk("openai", sluice)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="gemini-mock", messages=[{"role": "user", "content": "hi"}],
                                       tools=tools, parallel_tool_calls=False, max_tokens=10)
    assert e.value.body["param"] == "parallel_tool_calls"
