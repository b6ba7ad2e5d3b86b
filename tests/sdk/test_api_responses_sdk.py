"""The Responses API (`client.responses`) through Sluice with the official `openai` SDK,
each case against a native upstream (the mock's OpenAI `/v1/responses`, model
`gpt-4o-mini`) and a translated one (the mock's Anthropic `/v1/messages`, model
`claude-mock`).

Named to sort before test_openai_sdk.py, whose last tests stop the session's gateway.
"""

from __future__ import annotations

import json

import openai
import pytest
from openai import OpenAI

from conftest import (
    ANTHROPIC_UPSTREAM_KEY,
    MOCK_COMPLETION_TOKENS,
    MOCK_PROMPT_TOKENS,
    MOCK_TEXT,
    UPSTREAM_KEY,
)

BOGUS_TOKEN = "sk-sl-bogusBOGUSbogus0000000000000000000000000000ZZ"
MODELS = ["gpt-4o-mini", "claude-mock"]
TOOLS = [
    {
        "type": "function",
        "name": "lookup_vehicle",
        "description": "Find a vehicle by VIN.",
        "parameters": {
            "type": "object",
            "properties": {"vin": {"type": "string"}},
            "required": ["vin"],
        },
    }
]


@pytest.mark.parametrize("model", MODELS)
def test_responses_create(client, model):
    r = client.responses.create(model=model, input="Say hello.", instructions="Be kind.")
    assert r.object == "response"
    assert r.id.startswith("resp_")
    assert r.status == "completed"
    assert r.output_text == MOCK_TEXT
    assert r.usage.input_tokens == MOCK_PROMPT_TOKENS
    assert r.usage.output_tokens == MOCK_COMPLETION_TOKENS
    assert r.usage.total_tokens == MOCK_PROMPT_TOKENS + MOCK_COMPLETION_TOKENS
    again = client.responses.retrieve(r.id)
    assert again.id == r.id and again.output_text == MOCK_TEXT


@pytest.mark.parametrize("model", MODELS)
def test_responses_stream(client, model):
    with client.responses.stream(model=model, input="Say hello.") as stream:
        kinds = []
        text = ""
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        final = stream.get_final_response()
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert text == MOCK_TEXT
    assert final.output_text == MOCK_TEXT
    assert final.usage.output_tokens == MOCK_COMPLETION_TOKENS
    assert client.responses.retrieve(final.id).output_text == MOCK_TEXT


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("streamed", [False, True])
def test_function_tool_round_trip(client, model, streamed):
    if streamed:
        with client.responses.stream(model=model, input="Which car is WVWZZZ1JZXW000001?", tools=TOOLS) as s:
            for _ in s:
                pass
            first = s.get_final_response()
    else:
        first = client.responses.create(model=model, input="Which car is WVWZZZ1JZXW000001?", tools=TOOLS)
    calls = [i for i in first.output if i.type == "function_call"]
    assert len(calls) == 1
    assert calls[0].name == "lookup_vehicle"
    assert json.loads(calls[0].arguments) == {"vin": "WVWZZZ1JZXW000001"}
    second = client.responses.create(
        model=model,
        tools=TOOLS,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"model": "Golf"}'}],
    )
    assert second.output_text == MOCK_TEXT
    assert second.previous_response_id == first.id


@pytest.mark.parametrize("model", MODELS)
def test_previous_response_id_continues_the_conversation(client, sluice, model):
    first = client.responses.create(model=model, input="My car is a Golf.")
    second = client.responses.create(model=model, input="Which car is mine?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert second.output_text == MOCK_TEXT
    # The upstream got the whole conversation: both user turns and the first answer.
    key = ANTHROPIC_UPSTREAM_KEY if model == "claude-mock" else UPSTREAM_KEY
    bodies = sluice.mock_stats()["keys"][key]["last_bodies"]
    sent = [b for b in bodies if "Which car is mine?" in json.dumps(b)][-1]
    seen = json.dumps(sent)
    assert "My car is a Golf." in seen and MOCK_TEXT in seen
    if model == "claude-mock":
        assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    else:
        assert sent["store"] is False and "previous_response_id" not in sent


@pytest.mark.parametrize("model", MODELS)
def test_errors_raise_the_sdk_exception_classes(client, sluice, model):
    bogus = OpenAI(base_url=sluice.base_url, api_key=BOGUS_TOKEN, max_retries=0, timeout=10.0)
    with pytest.raises(openai.AuthenticationError):
        bogus.responses.create(model=model, input="hi")
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=model, input=[{"type": "web_search_call", "id": "ws_1"}])
    assert "web_search_call" in str(bad.value)
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=model, input="hi", tools=[{"type": "web_search"}])
    assert "web_search" in str(bad.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model, input="hi", previous_response_id="resp_doesnotexist")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_doesnotexist")
    # A budget that cannot cover one worst case: 429 insufficient_quota.
    poor = sluice.issue_token(f"poor-{model}", "0.000001")
    broke = OpenAI(base_url=sluice.base_url, api_key=poor["token"], max_retries=0, timeout=10.0)
    with pytest.raises(openai.RateLimitError) as limited:
        broke.responses.create(model=model, input="hi")
    assert limited.value.code == "insufficient_quota"


def test_another_tokens_response_is_not_found(client, sluice):
    r = client.responses.create(model="gpt-4o-mini", input="hi")
    other = sluice.issue_token("someone-else")
    theirs = OpenAI(base_url=sluice.base_url, api_key=other["token"], max_retries=0, timeout=10.0)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(model="gpt-4o-mini", input="go on", previous_response_id=r.id)
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
