"""Both wire formats, both directions, through the official SDKs.

Four combinations: OpenAI SDK → OpenAI upstream, OpenAI SDK → Anthropic upstream,
Anthropic SDK → Anthropic upstream, Anthropic SDK → OpenAI upstream. `gpt-4o-mini` routes
to the mock's OpenAI side, `claude-mock` to its Anthropic side; the mock checks the
Anthropic request rules, and each test checks what it received.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from conftest import ANTHROPIC_UPSTREAM_KEY, MOCK_COMPLETION_TOKENS, MOCK_PROMPT_TOKENS, MOCK_TEXT, UPSTREAM_KEY

UPSTREAM_OF = {"gpt-4o-mini": UPSTREAM_KEY, "claude-mock": ANTHROPIC_UPSTREAM_KEY}
COMBOS = [("openai", "gpt-4o-mini"), ("openai", "claude-mock"), ("anthropic", "claude-mock"), ("anthropic", "gpt-4o-mini")]
TOOL_ARGS = {"vin": "WVWZZZ1JZXW000001"}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def sdk(kind, sluice, token=None):
    token = token or sluice.token
    if kind == "openai":
        return openai.OpenAI(base_url=sluice.base_url, api_key=token, max_retries=0, timeout=10.0)
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{sluice.gw_port}", api_key=token, max_retries=0, timeout=10.0)


def last_body(sluice, model):
    return sluice.mock_stats()["keys"][UPSTREAM_OF[model]]["last_bodies"][-1]


def ask(kind, client, model, messages, **kw):
    if kind == "openai":
        return client.chat.completions.create(model=model, messages=messages, max_tokens=200, **kw)
    return client.messages.create(model=model, messages=messages, max_tokens=200, **kw)


def text_of(kind, r):
    if kind == "openai":
        return r.choices[0].message.content
    return "".join(b.text for b in r.content if b.type == "text")


@pytest.mark.parametrize("kind,model", COMBOS)
def test_plain_answer(sluice, kind, model):
    r = ask(kind, sdk(kind, sluice), model, [{"role": "user", "content": "hello"}])
    assert text_of(kind, r) == MOCK_TEXT
    if kind == "openai":
        assert r.usage.prompt_tokens == 12 and r.usage.completion_tokens == 24
    else:
        assert r.usage.input_tokens == 12 and r.usage.output_tokens == 24
    sent = last_body(sluice, model)
    assert sent["max_tokens"] == 200
    assert sent["model"] == ("claude-mock-upstream" if model == "claude-mock" else "gpt-4o-mini")


@pytest.mark.parametrize("kind,model", COMBOS)
def test_streaming_reassembles_exactly(sluice, kind, model):
    client = sdk(kind, sluice)
    if kind == "openai":
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=50, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    else:
        with client.messages.stream(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=50) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert final.stop_reason == "end_turn"
        assert final.usage.output_tokens == 24
    assert text == MOCK_TEXT


@pytest.mark.parametrize("kind,model", COMBOS)
def test_system_prompt_reaches_the_upstream_in_its_format(sluice, kind, model):
    client = sdk(kind, sluice)
    if kind == "openai":
        ask(kind, client, model, [{"role": "system", "content": "You diagnose cars."}, {"role": "user", "content": "hi"}])
    else:
        ask(kind, client, model, [{"role": "user", "content": "hi"}], system="You diagnose cars.")
    sent = last_body(sluice, model)
    if model == "claude-mock":
        assert sent["system"] == "You diagnose cars."
        assert all(m["role"] != "system" for m in sent["messages"])
    else:
        assert sent["messages"][0] == {"role": "system", "content": "You diagnose cars."}


@pytest.mark.parametrize("kind,model", COMBOS)
def test_an_image_reaches_the_upstream_in_its_format(sluice, kind, model):
    if kind == "openai":
        content = [{"type": "text", "text": "What light is this?"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
    else:
        content = [{"type": "text", "text": "What light is this?"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]
    r = ask(kind, sdk(kind, sluice), model, [{"role": "user", "content": content}])
    assert text_of(kind, r) == MOCK_TEXT
    part = last_body(sluice, model)["messages"][-1]["content"][1]
    if model == "claude-mock":
        assert part == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    else:
        assert part == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}


@pytest.mark.parametrize("kind,model", COMBOS)
def test_tool_use_round_trip(sluice, kind, model):
    client = sdk(kind, sluice)
    schema = {"type": "object", "properties": {"vin": {"type": "string"}}, "required": ["vin"]}
    user = {"role": "user", "content": "Which car is WVWZZZ1JZXW000001?"}
    if kind == "openai":
        tools = [{"type": "function", "function": {"name": "lookup_vin", "description": "Find a vehicle", "parameters": schema}}]
        r1 = ask(kind, client, model, [user], tools=tools)
        assert r1.choices[0].finish_reason == "tool_calls"
        call = r1.choices[0].message.tool_calls[0]
        assert call.function.name == "lookup_vin" and json.loads(call.function.arguments) == TOOL_ARGS
        follow = [user, r1.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": "Golf, 2019"}]
        r2 = ask(kind, client, model, follow, tools=tools)
        call_id = call.id
    else:
        tools = [{"name": "lookup_vin", "description": "Find a vehicle", "input_schema": schema}]
        r1 = ask(kind, client, model, [user], tools=tools)
        assert r1.stop_reason == "tool_use"
        use = next(b for b in r1.content if b.type == "tool_use")
        assert use.name == "lookup_vin" and use.input == TOOL_ARGS
        follow = [user, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Golf, 2019"}]}]
        r2 = ask(kind, client, model, follow, tools=tools)
        call_id = use.id
    assert text_of(kind, r2) == MOCK_TEXT
    sent = last_body(sluice, model)
    if model == "claude-mock":
        result = sent["messages"][-1]["content"][0]
        assert result["type"] == "tool_result" and result["tool_use_id"] == call_id
        assert sent["tools"][0]["name"] == "lookup_vin" and sent["tools"][0]["input_schema"] == schema
    else:
        assert sent["messages"][-1] == {"role": "tool", "tool_call_id": call_id, "content": "Golf, 2019"}
        assert sent["tools"][0]["function"]["parameters"] == schema


@pytest.mark.parametrize("kind,model", COMBOS)
def test_each_sdk_raises_its_own_errors(sluice, kind, model):
    errors = openai if kind == "openai" else anthropic
    with pytest.raises(errors.AuthenticationError):
        ask(kind, sdk(kind, sluice, "sk-sl-not-a-real-token"), model, [{"role": "user", "content": "hi"}])
    broke = sluice.issue_token(f"broke-{kind}-{model}", "0.000001")["token"]
    with pytest.raises(errors.RateLimitError):
        ask(kind, sdk(kind, sluice, broke), model, [{"role": "user", "content": "hi"}])
    with pytest.raises(errors.BadRequestError) as err:
        client = sdk(kind, sluice)
        if kind == "openai":
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=10_000_000)
        else:
            client.messages.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=10_000_000)
    assert "max_tokens" in str(err.value)


def test_translated_stream_reports_the_actual_input_tokens(sluice):
    """Anthropic SDK → OpenAI-format upstream, streamed: the final message's usage carries
    the upstream's actual input figure, not the gateway's estimate from `message_start`
    (the SDK takes `input_tokens` from `message_delta.usage` when it is there)."""
    client = sdk("anthropic", sluice)
    # A prompt long enough that the gateway's estimate cannot equal the mock's 12 tokens.
    prompt = "Why does the engine warning light blink after the car stood in the cold overnight? " * 3
    with client.messages.stream(model="gpt-4o-mini", max_tokens=60, messages=[{"role": "user", "content": prompt}]) as s:
        estimate = None
        for event in s:
            if event.type == "message_start":
                estimate = event.message.usage.input_tokens
        final = s.get_final_message()
    assert estimate is not None and estimate != MOCK_PROMPT_TOKENS, "the estimate is the gateway's own count"
    assert final.usage.input_tokens == MOCK_PROMPT_TOKENS
    assert final.usage.output_tokens == MOCK_COMPLETION_TOKENS
    assert "".join(b.text for b in final.content if b.type == "text") == MOCK_TEXT
    assert final.stop_reason == "end_turn"
