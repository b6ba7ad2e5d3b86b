"""A Bedrock-backed model through the official SDKs: `claude-bedrock` routes to the mock's
Bedrock side (Converse / ConverseStream, Bedrock API key as bearer), reached by an OpenAI
SDK client and an Anthropic SDK client, streaming and tools included."""

from __future__ import annotations

import anthropic
import openai

from conftest import MOCK_COMPLETION_TOKENS, MOCK_PROMPT_TOKENS, MOCK_TEXT

MODEL = "claude-bedrock"
TOOLS_OPENAI = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def oai(sluice):
    return openai.OpenAI(base_url=sluice.base_url, api_key=sluice.token, max_retries=0, timeout=10.0)


def ant(sluice):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{sluice.gw_port}", api_key=sluice.token, max_retries=0, timeout=10.0)


def bedrock_paths(sluice):
    return sluice.mock_stats()["keys"]["bedrock-sdk-key"]["last_paths"]


def test_openai_sdk_chat_and_stream(sluice):
    client = oai(sluice)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=100)
    assert r.choices[0].message.content == MOCK_TEXT
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (MOCK_PROMPT_TOKENS, MOCK_COMPLETION_TOKENS)
    assert bedrock_paths(sluice)[-1] == "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"

    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=100, stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
        usage = chunk.usage or usage
    assert text == MOCK_TEXT
    assert usage.completion_tokens == MOCK_COMPLETION_TOKENS
    assert bedrock_paths(sluice)[-1].endswith("/converse-stream")


def test_openai_sdk_tools_round_trip(sluice):
    client = oai(sluice)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS_OPENAI, max_tokens=100)
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    r = client.chat.completions.create(
        model=MODEL, tools=TOOLS_OPENAI, max_tokens=100,
        messages=[
            {"role": "user", "content": "weather?"},
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "12 C"},
        ],
    )
    assert r.choices[0].finish_reason == "stop"


def test_anthropic_sdk_message_and_stream(sluice):
    client = ant(sluice)
    m = client.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text == MOCK_TEXT
    assert m.usage.output_tokens == MOCK_COMPLETION_TOKENS
    with client.messages.stream(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == MOCK_TEXT
    assert final.usage.output_tokens == MOCK_COMPLETION_TOKENS


def test_a_refused_field_is_the_sdks_bad_request(sluice):
    client = oai(sluice)
    try:
        client.chat.completions.create(
            model=MODEL, max_tokens=100,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}],
        )
    except openai.BadRequestError as e:
        assert e.body["param"] == "image_url"
    else:
        raise AssertionError("an image by URL must be refused for a Bedrock model")
